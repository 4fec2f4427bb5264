"""A local OpenEnv server starts without Gradio when its web UI is off, and keeps the UI when asked.

OpenEnv's server package imports its Gradio web UI on import, seconds of CPU in every server
process a local source starts. ``local_servers/serve.py`` (the script every local server runs) hides Gradio
for that one import when ``ENABLE_WEB_INTERFACE`` is off. Each case runs in a child process, as
the script does, since the import state is the whole process's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("openenv")

ECHO = Path(__file__).resolve().parents[1] / "envs" / "openenv_echo_env"

_CHILD = textwrap.dedent("""
    import json, sys
    from openenv_gym.adapters.local_servers import serve

    app = serve._load_app(__import__("pathlib").Path(sys.argv[1]), "server.app:app")
    from openenv.core import env_server
    report = {"app": type(app).__name__, "gradio_loaded": "gradio" in sys.modules,
              "web_ui": env_server.create_web_interface_app is not None}
    import gradio  # an env's own import of Gradio still works afterwards
    report["gradio_later"] = hasattr(gradio, "Blocks")
    print(json.dumps(report))
""")


def child(web: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ENABLE_WEB_INTERFACE"}
    if web is not None:
        env["ENABLE_WEB_INTERFACE"] = web
    done = subprocess.run([sys.executable, "-c", _CHILD, str(ECHO)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("web", [None, "false", "0"])
def test_a_server_with_the_web_ui_off_starts_without_gradio(web: str | None) -> None:
    assert child(web) == {"app": "FastAPI", "gradio_loaded": False, "web_ui": False, "gradio_later": True}


def test_a_server_with_the_web_ui_on_keeps_it() -> None:
    assert child("true") == {"app": "FastAPI", "gradio_loaded": True, "web_ui": True, "gradio_later": True}
