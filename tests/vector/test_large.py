"""A vector env of thousands of sub-envs in this process tunes the garbage collector it runs
under, unless the user set it: with Python's defaults the collector walks every request in
flight again and again.

Each case runs in a subprocess, so this process's collector is never touched.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize(("num_envs", "preset", "tuned"), [
    (1024, None, True),  # Python's defaults: tuned
    (1024, (900, 10, 10), False),  # the user's own setting: left alone
    (64, None, False),  # a small vector env: left alone
])
def test_thousands_of_sub_envs_tune_the_collector_unless_it_was_set(num_envs, preset, tuned):
    out = run(f"""
        import gc
        if {preset!r} is not None:
            gc.set_threshold(*{preset!r})
        before = gc.get_threshold()
        import gymnasium as gym, openenv_gym
        envs = gym.make_vec("openenv/Arithmetic-v0", num_envs={num_envs}, in_process=True)
        obs, infos = envs.reset(seed=0)
        print("errors", int(infos["_error"].sum()) if "error" in infos else 0)
        print("threshold", "tuned" if gc.get_threshold() == (50000, 20, 100) else
              "unchanged" if gc.get_threshold() == before else gc.get_threshold())
        envs.close()
    """)
    assert "errors 0" in out and f"threshold {'tuned' if tuned else 'unchanged'}" in out, out
