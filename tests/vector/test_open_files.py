"""File descriptors: a vector env checks its process's open-files limit before it starts, raises
the soft limit where the hard one allows, and a sub-env that failed for want of descriptors says
so and recovers once descriptors are free again.

Each case runs in a subprocess whose limits the test sets (``resource.setrlimit``), never this one.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_a_low_soft_limit_is_raised_so_every_sub_env_works():
    out = run("""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        import gymnasium as gym, openenv_gym
        envs = gym.make_vec("openenv/Arithmetic-v0", num_envs=1024)
        obs, infos = envs.reset(seed=0)
        print("errors", int(infos["_error"].sum()) if "error" in infos else 0)
        print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 1024)
        if "error" in infos:  # what went wrong, for the assertion's message
            print(sorted({m[:200] for m, bad in zip(infos["error"]["message"], infos["_error"]) if bad}))
        envs.close()
    """)
    assert "errors 0" in out and "soft True" in out, out


def test_a_hard_limit_too_low_is_a_clear_error_before_anything_starts():
    out = run("""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 300))
        import gymnasium as gym, openenv_gym
        from openenv_gym.testing import procs
        try:
            gym.make_vec("openenv/Arithmetic-v0", num_envs=1024)
        except ValueError as exc:
            print(type(exc).__name__, exc)
        print("left", procs.descendants())
    """)
    assert "ConfigurationError 1024 sub-envs need about" in out and "ulimit -Hn" in out
    # 1,024 sockets and 128 of the process's own; a host may hold 300 - 128 of the sockets
    assert "python=sys.executable with vector_options={'num_hosts': 6}" in out
    assert "left []" in out


def test_sub_envs_in_process_count_no_descriptors_so_a_low_hard_limit_holds_thousands():
    # 2,048 sessions of an ORS env run in this process open no socket each: the check counts what
    # a configuration opens, so a process allowed 300 files runs them (one counted per session
    # refused this; see the test above for the same env over its local server)
    out = run("""
        import json, resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 300))
        import gymnasium as gym, openenv_gym
        envs = gym.make_vec("openenv/Arithmetic-v0", num_envs=2048, in_process=True)
        obs, infos = envs.reset(seed=0)
        print("errors", int(infos["_error"].sum()) if "error" in infos else 0)
        call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "calculator", "arguments": json.dumps({"expression": "1+1"})}}]}
        obs, rewards, terminated, truncated, infos = envs.step([call] * 2048)
        print("stepped", "error" not in infos, len(obs))
        envs.close()
    """)
    assert "errors 0" in out and "stepped True 2048" in out, out


def test_sub_envs_that_ran_out_of_descriptors_say_so_and_recover():
    out = run("""
        import json, resource, time
        import gymnasium as gym, openenv_gym
        from openenv_gym.adapters.net import http1
        envs = gym.make_vec("openenv/Arithmetic-v0", num_envs=32, vector_options={"envs_per_client": 1})
        time.sleep(http1.LOCAL_IDLE_LIMIT + 1)  # the start's idle connections close: none left to give back
        hog = []
        try:  # take every descriptor left
            while True:
                hog.append(open("/dev/null"))
        except OSError:
            pass
        obs, infos = envs.reset(seed=1)  # the sub-envs' first connections: no descriptor left for them
        failed = int(infos["_error"].sum()) if "error" in infos else 0
        messages = set(infos["error"]["message"][infos["_error"]]) if failed else set()
        for f in hog:
            f.close()
        obs, infos = envs.reset(seed=2)
        print("failed", failed > 0)
        print("says", all("file descriptors" in m for m in messages))
        print("recovered", "error" not in infos)
        envs.close()
    """)
    assert "failed True" in out and "says True" in out and "recovered True" in out

