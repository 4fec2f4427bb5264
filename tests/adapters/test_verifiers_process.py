"""What making a Verifiers env changes in this process: nothing that outlives ``close()``.

A ``source=`` must be importable by name while the env is open (``sys.path``, ``sys.modules``,
``PYTHONPATH`` for v1 tool servers); a legacy env's construction asks for SIGINT/SIGTERM
handlers and an ``atexit`` teardown. After ``close()`` every one of them is as it was, so that a
later ``env_id=`` lookup finds only what is installed, and no handler of the process ever changes,
whichever thread builds the env.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import signal
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import openenv_gym  # noqa: F401 - registers openenv/Verifiers-v0
from openenv_gym import runtime
from openenv_gym.adapters.verifiers.process import ProcessState
from openenv_gym.errors import ConfigurationError

ENVS = Path(__file__).resolve().parents[1] / "envs"

PROBED_V0 = '''
import verifiers as vf
from datasets import Dataset


def load_environment(probe=None, **kwargs):
    def exact_match(completion, answer) -> float:
        return float((completion[-1]["content"] or "").strip() == answer) if completion else 0.0

    env = vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "What is 2 + 3?", "answer": "5"}]),
                           rubric=vf.Rubric(funcs=[exact_match]))
    if probe is not None:
        probe()  # after the library's Environment.__post_init__ ran
    return env
'''


def needs_v0() -> Any:
    vf = pytest.importorskip("verifiers")
    if not vf.__version__.startswith(("0.2", "0.3")):
        pytest.skip("needs verifiers<0.4 (the legacy v0 API)")
    return vf


def process_view(module: str) -> tuple[list[str], bool, str | None, str | None]:
    return (list(sys.path), module in sys.modules, os.environ.get("PYTHONPATH"), os.environ.get("PATH"))


def test_a_v0_source_is_importable_while_open_and_gone_after_close(tmp_path: Path) -> None:
    needs_v0()
    (tmp_path / "vf_probe_scope.py").write_text(PROBED_V0)
    before = process_view("vf_probe_scope")
    env = gym.make("openenv/Verifiers-v0", source=str(tmp_path / "vf_probe_scope.py"))
    try:
        assert "vf_probe_scope" in sys.modules and str(tmp_path.resolve()) in sys.path
        obs, _ = env.reset(options={"index": 0})
        assert env.step("5")[1] == 1.0
    finally:
        env.close()
    assert process_view("vf_probe_scope") == before
    assert importlib.util.find_spec("vf_probe_scope") is None
    # So a later lookup by id finds what is installed, not what a source once put on sys.path.
    with pytest.raises(ConfigurationError, match="is not installed"):
        gym.make("openenv/Verifiers-v0", env_id="vf_probe_scope")


def test_building_a_v0_env_never_touches_the_process_handlers_from_any_thread(tmp_path: Path) -> None:
    """Not even for the duration of the build: seen from inside ``load_environment``, after the
    library asked for its SIGINT/SIGTERM handlers."""
    needs_v0()
    from openenv_gym.adapters.verifiers.v0 import VerifiersV0Adapter

    (tmp_path / "vf_probe_signals.py").write_text(PROBED_V0)
    source = str(tmp_path / "vf_probe_signals.py")
    real_signal = signal.signal
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    seen: list[tuple] = []

    def probe() -> None:
        other: list[BaseException | None] = []

        def elsewhere() -> None:  # another thread's signal.signal behaves as Python's own
            try:
                signal.signal(signal.SIGUSR1, signal.SIG_DFL)
                other.append(None)
            except BaseException as exc:  # noqa: BLE001 - compared below
                other.append(exc)

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()
        seen.append((threading.current_thread() is threading.main_thread(), signal.signal is real_signal,
                     (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers,
                     type(other[0]).__name__))

    adapters = [VerifiersV0Adapter(source=source, env_args={"probe": probe})]  # the main thread
    worker = threading.Thread(target=lambda: adapters.append(VerifiersV0Adapter(source=source, env_args={"probe": probe})))
    worker.start()
    worker.join(120)
    try:
        assert len(adapters) == 2
        assert seen == [(True, True, True, "ValueError"), (False, True, True, "ValueError")]
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
        assert signal.signal is real_signal
    finally:
        for adapter in adapters:
            runtime.run_sync(adapter.aclose(), 60)


def test_a_closed_v0_env_is_not_kept_alive_by_an_exit_hook(tmp_path: Path) -> None:
    """The library registers the env's teardown with atexit; after close() nothing holds the env."""
    needs_v0()
    from openenv_gym.adapters.verifiers.v0 import VerifiersV0Adapter

    (tmp_path / "vf_probe_atexit.py").write_text(PROBED_V0)
    adapter = VerifiersV0Adapter(source=str(tmp_path / "vf_probe_atexit.py"))
    runtime.run_sync(adapter.start(), 60)
    env = weakref.ref(adapter.env)
    runtime.run_sync(adapter.aclose(), 60)
    del adapter
    gc.collect()
    assert env() is None


def test_a_v1_source_is_importable_while_open_and_gone_after_close(tmp_path: Path) -> None:
    from openenv_gym.adapters.verifiers import v1 as verifiers_v1

    try:
        verifiers_v1._import_v1()
    except ConfigurationError as exc:
        pytest.skip(f"verifiers.v1 is not usable here: {exc}")
    shutil.copytree(ENVS / "verifiers_v1" / "vf1_arith", tmp_path / "vf1_probe_scope")
    before = process_view("vf1_probe_scope")
    env = gym.make("openenv/Verifiers-v0", source=str(tmp_path / "vf1_probe_scope"))
    try:
        root = str(tmp_path.resolve())
        assert "vf1_probe_scope" in sys.modules and root in sys.path
        assert root in os.environ["PYTHONPATH"].split(os.pathsep)  # tool servers run as python -m
        env.reset(options={"index": 0})
        assert env.step("5")[1] == 1.0
    finally:
        env.close()
    assert process_view("vf1_probe_scope") == before
    with pytest.raises(ConfigurationError, match="is not installed"):
        gym.make("openenv/Verifiers-v0", env_id="vf1_probe_scope")


def test_process_state_counts_holders_and_restores_a_shadowed_module(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    state = ProcessState()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "probe_shadow.py").write_text(f"WHERE = {name!r}\n")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    path_before = list(sys.path)
    a = state.acquire(tmp_path / "a", pythonpath=True)
    state.acquire(tmp_path / "a", pythonpath=True)  # a second holder of the same root
    import probe_shadow

    assert probe_shadow.WHERE == "a" and os.environ["PYTHONPATH"] == str(a)
    state.release(a, pythonpath=True)
    assert sys.modules["probe_shadow"] is probe_shadow and str(a) in sys.path  # still held once
    b = state.acquire(tmp_path / "b")
    spec = importlib.util.spec_from_file_location("probe_shadow", b / "probe_shadow.py")
    shadow = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shadow)
    sys.modules["probe_shadow"] = shadow  # what the v0 adapter does for a same-named source
    state.release(b)
    assert sys.modules["probe_shadow"] is probe_shadow  # a's module is back: a is still open
    state.release(a, pythonpath=True)
    assert "probe_shadow" not in sys.modules and sys.path == path_before
    assert "PYTHONPATH" not in os.environ
    state.release(a)  # one release too many: nothing happens
    assert sys.path == path_before
