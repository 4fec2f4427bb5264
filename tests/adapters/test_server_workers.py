"""``server_workers=K``: a local source served by K real server processes, sessions spread and sticky.

The ORS side uses ``tests/envs/cpu_burn.py``, whose ``burn`` tool answers with the PID of the
process that ran it and the session's own call count, so a test sees which worker served each
request and that the session's state was there. The OpenEnv side uses the grid environment of
``tests/envs/openenv_grid_env``; which worker holds a socket is read from the kernel's table of
Unix socket connections. Every server is started by the adapters and checked dead by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest
from conftest import ENVS, pid_alive  # noqa: E402
from hypothesis import given, settings
from hypothesis import strategies as st

import openenv_gym  # noqa: F401  (registers the ids)
from openenv_gym.adapters.local_servers import group as server_groups
from openenv_gym.adapters.openenv.adapter import OpenEnvAdapter
from openenv_gym.adapters.ors.adapter import ORSAdapter
from openenv_gym.errors import ConfigurationError
from openenv_gym.testing import procs

pytestmark = pytest.mark.timeout(240)

BURN = str(ENVS / "cpu_burn.py")
GRID = str(ENVS / "openenv_grid_env")


def call(name: str, **arguments) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{name}", "type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def burn(ms: float = 1.0) -> dict:
    return call("burn", ms=ms)


def served(obs) -> list[tuple[int, int]]:
    """``(server pid, the session's call count)`` of each sub-env's ``burn`` answer."""
    return [tuple(int(x) for x in o[0]["content"].split()) for o in obs]


def serve_children() -> set[int]:
    """Server processes this test process launched that are still running."""
    return {p for p in procs.children(os.getpid()) if "local_servers/serve.py" in procs.cmdline(p)}


def wait_dead(pids, seconds: float = 20.0) -> list[int]:
    return procs.wait_dead(pids, seconds)


def burn_vec(num_envs: int, workers: int | None = 2, **kwargs):
    extra = {} if workers is None else {"server_workers": workers}
    return gym.make_vec("openenv/ORS-v0", num_envs=num_envs, source=BURN, env_class="CpuBurn",
                        vector_options={"envs_per_client": 2}, **extra, **kwargs)


# -- bad K -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, [2], server_groups.MAX_SERVER_WORKERS + 1])
def test_a_bad_worker_count_is_a_configuration_error_and_starts_nothing(bad):
    before = serve_children()
    with pytest.raises(ConfigurationError, match="server_workers must be a whole number"):
        gym.make("openenv/ORS-v0", source=BURN, env_class="CpuBurn", server_workers=bad)
    with pytest.raises(ConfigurationError, match="server_workers must be a whole number"):
        gym.make_vec("openenv/ORS-v0", num_envs=2, source=BURN, env_class="CpuBurn", server_workers=bad)
    with pytest.raises(ConfigurationError, match="server_workers must be a whole number"):
        OpenEnvAdapter(source=GRID, server_workers=bad)
    with pytest.raises(ConfigurationError, match="server_workers must be a whole number"):
        ORSAdapter(source=BURN, server_workers=bad)
    assert serve_children() <= before


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(), st.floats(allow_nan=True), st.booleans(), st.none(), st.text(max_size=5),
                 st.lists(st.integers(), max_size=2), st.decimals(allow_nan=False),
                 st.integers(-5, 300).map(np.int64)))
def test_any_worker_count_from_a_catalog_is_accepted_or_refused_clearly(value):
    """Kwargs may come from a catalog file: whatever the value, a valid count or a ConfigurationError."""
    integer = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    valid = integer and 1 <= value <= server_groups.MAX_SERVER_WORKERS
    try:
        got = server_groups.check_workers(value)
        assert (got == value and type(got) is int and valid) or (got is None and value is None)
    except ConfigurationError as exc:
        assert not valid and value is not None
        assert "server_workers must be a whole number" in str(exc) and len(str(exc)) < 200


def test_the_default_is_one_worker_for_a_single_env_and_follows_the_cores_for_a_vector_env(monkeypatch):
    monkeypatch.setattr(server_groups, "_cores", lambda: 4)
    assert [server_groups.default_workers(n) for n in (None, 1, 2, 8, 9, 16, 24, 1024)] == [1, 1, 1, 1, 2, 2, 3, 4]
    monkeypatch.setattr(server_groups, "_cores", lambda: 64)
    assert server_groups.default_workers(1024) == server_groups.MAX_DEFAULT_WORKERS
    monkeypatch.undo()

    env = gym.make("openenv/ORS-v0", source=BURN, env_class="CpuBurn")
    envs = burn_vec(16, workers=None)
    try:
        assert len(env.unwrapped.adapter.server_pids()) == 1
        pids = envs.adapters[0].server_pids()
        assert len(pids) == server_groups.default_workers(16) == min(2, server_groups._cores())
        assert env.unwrapped.adapter.server_pid() not in pids, "a different worker count is another server"
    finally:
        envs.close()
        env.close()


def test_workers_expecting_thousands_of_sessions_run_asyncio_s_loop_and_a_few_sessions_uvloop_s():
    """Saturated by thousands of sessions, a uvicorn on uvloop left new connections unaccepted for
    30 s (benchmarks/scale.py at 16,384); a single env's steps are quicker on uvloop."""
    def loops(vec) -> set[str]:
        return {procs.cmdline(p).split("--loop ", 1)[1].split()[0] for p in vec.adapters[0].server_pids()}

    few = burn_vec(4, workers=1)
    crowded = gym.make_vec("openenv/ORS-v0", num_envs=2 * server_groups.CROWDED_WORKER, source=BURN,
                           env_class="CpuBurn", server_workers=2)
    try:
        assert loops(few) == {"auto"}
        assert loops(crowded) == {"asyncio"} and len(crowded.adapters[0].server_pids()) == 2
        obs, _ = crowded.reset(seed=0)  # and it serves
        assert len(obs) == 2 * server_groups.CROWDED_WORKER
    finally:
        crowded.close()
        few.close()


# -- K processes, sessions spread over them and kept on theirs -------------------------------------
def test_two_workers_serve_one_vector_env_with_sessions_spread_and_sticky():
    before = serve_children()
    envs = burn_vec(6, max_turns=50)
    try:
        adapters = envs.adapters
        pids = adapters[0].server_pids()
        assert len(adapters) == 3 and len(set(pids)) == 2
        assert all(a.server_pids() == pids for a in adapters), "the adapters of one vector env share the workers"
        assert set(pids) <= serve_children() - before and all(pid_alive(p) for p in pids)

        envs.reset(seed=0)
        assert adapters[0].server_sessions() == [3, 3]
        first = served(envs.step([burn()] * 6)[0])
        assert {pid for pid, _ in first} == set(pids), "both workers serve sessions"
        assert [n for _, n in first] == [1] * 6
        for step in (2, 3):  # every request of a session goes to the worker that holds it
            assert served(envs.step([burn()] * 6)[0]) == [(pid, step) for pid, _ in first]

        # A finished episode frees its place: the next one goes to the worker with fewer sessions.
        _, rewards, terminated, _, _ = envs.step([call("finish")] + [burn()] * 5)
        assert terminated.tolist() == [True] + [False] * 5 and rewards[0] == 1.0
        envs.step([burn()] * 6)  # autoreset of sub-env 0 (its action is ignored)
        assert sorted(adapters[0].server_sessions()) == [3, 3]
        (pid0, n0), *_ = served(envs.step([burn()] * 6)[0])
        assert (pid0, n0) == (first[0][0], 1), "the new episode went to the worker its old one left"
    finally:
        envs.close()
    assert wait_dead(pids) == [], "close must stop every worker"
    assert serve_children() <= before


@pytest.mark.needs("openenv")
def test_an_openenv_folder_env_plays_correctly_over_two_workers():
    envs = gym.make_vec("openenv/OpenEnv-v0", num_envs=4, source=GRID, server_workers=2,
                        vector_options={"envs_per_client": 2})
    try:
        adapters = envs.adapters
        pids = adapters[0].server_pids()
        assert len(set(pids)) == 2 and all(a.server_pids() == pids for a in adapters)
        for seed in (0, 1):
            envs.reset(seed=seed)
            assert adapters[0].server_sessions() == [2, 2]
            assert all(n >= 2 for n in connections(adapters[0])), "each worker holds sockets of the episodes"
            rewards = []
            for move in ("RIGHT", "RIGHT", "DOWN", "DOWN"):
                obs, reward, terminated, truncated, infos = envs.step([call("step", move=move)] * 4)
                assert "error" not in infos
                rewards.append(reward)
            np.testing.assert_allclose(rewards, [[-0.1] * 4] * 3 + [[1.0] * 4])
            assert terminated.all() and not truncated.any()
            assert [o[0]["content"] for o in obs] == ["x: 2\ny: 2\nmessage: You found the goal!"] * 4
            assert infos["metadata"]["steps"].tolist() == [4] * 4, "every step of an episode hit its one instance"
            envs.step([call("step", move="UP")] * 4)  # autoreset: the sockets go back to their workers' pools
            assert adapters[0].server_sessions() == [2, 2]
    finally:
        envs.close()
    assert wait_dead(pids) == []


def connections(adapter) -> list[int]:
    """Open connections to each worker's Unix socket, from the kernel's table (accepted sockets carry its path)."""
    paths = [w.socket_path for w in adapter.endpoint.local.workers]
    counts = [0] * len(paths)
    with open("/proc/net/unix") as fh:
        next(fh)
        for line in fh:
            fields = line.split()
            if len(fields) >= 8 and fields[5] == "03" and fields[7] in paths:  # 03: connected
                counts[paths.index(fields[7])] += 1
    return counts


# -- a dead worker -------------------------------------------------------------------------------------
def test_a_killed_worker_fails_only_its_sessions_within_30_s_and_is_restarted():
    envs = burn_vec(4, max_turns=50)
    try:
        adapter = envs.adapters[0]
        pids = adapter.server_pids()
        envs.reset(seed=0)
        first = served(envs.step([burn()] * 4)[0])
        victim = pids[0]
        mine = np.array([pid == victim for pid, _ in first])
        assert mine.sum() == 2
        os.kill(victim, signal.SIGKILL)
        start = time.monotonic()
        obs, rewards, terminated, truncated, infos = envs.step([burn()] * 4)
        assert time.monotonic() - start < 30
        np.testing.assert_array_equal(infos["_error"], mine)
        np.testing.assert_array_equal(truncated, mine)
        assert set(infos["error"]["type"][mine]) == {"BackendUnavailable"}
        assert all("exited" in m for m in infos["error"]["message"][mine])
        for i in np.flatnonzero(~mine):  # the other worker's sessions went on, state intact
            assert served([obs[i]]) == [(first[i][0], 2)]

        envs.step([burn()] * 4)  # the failed sub-envs start new episodes: the dead worker is restarted
        now = adapter.server_pids()
        assert victim not in now and pids[1] in now and all(pid_alive(p) for p in now)
        assert all(a.server_pids() == now for a in envs.adapters)
        after = served(envs.step([burn()] * 4)[0])
        assert {pid for pid, _ in after} == set(now)
        for i in np.flatnonzero(~mine):
            assert after[i] == (first[i][0], 4)
    finally:
        envs.close()
    assert wait_dead(now) == []


@pytest.mark.slow  # a failure drill of many seconds: its own CI step (-m slow)
def test_a_killed_openenv_worker_fails_only_its_episodes():
    envs = gym.make_vec("openenv/OpenEnv-v0", num_envs=4, source=GRID, server_workers=2,
                        vector_options={"envs_per_client": 2})
    try:
        adapter = envs.adapters[0]
        pids = adapter.server_pids()
        envs.reset(seed=0)
        assert adapter.server_sessions() == [2, 2]
        os.kill(pids[1], signal.SIGKILL)
        start = time.monotonic()
        _, rewards, _, truncated, infos = envs.step([call("step", move="RIGHT")] * 4)
        assert time.monotonic() - start < 30
        assert infos["_error"].sum() == 2 and truncated.sum() == 2
        assert set(infos["error"]["type"][infos["_error"]]) == {"BackendUnavailable"}
        assert rewards[~infos["_error"]].tolist() == pytest.approx([-0.1, -0.1])
        envs.step([call("step", move="RIGHT")] * 4)  # restarts the worker, resets the failed sub-envs
        now = adapter.server_pids()
        assert now[0] == pids[0] and now[1] != pids[1] and all(pid_alive(p) for p in now)
        _, rewards, _, _, infos = envs.step([call("step", move="DOWN")] * 4)
        assert "error" not in infos
    finally:
        envs.close()
    assert wait_dead([*pids, *now]) == []


# -- nothing left behind -------------------------------------------------------------------------------
def test_close_stops_every_worker_and_removes_their_directories():
    env = gym.make("openenv/ORS-v0", source=BURN, env_class="CpuBurn", server_workers=3, listen="tcp")
    adapter = env.unwrapped.adapter
    pids = adapter.server_pids()
    folders = [w.workdir for w in adapter.endpoint.local.workers]
    tokens = {w.auth_headers()["Authorization"] for w in adapter.endpoint.local.workers}
    assert len(set(pids)) == 3 and all(f.is_dir() for f in folders)
    assert len(tokens) == 3, "each TCP worker has its own token"
    assert not any(t.split()[1] in repr(adapter.endpoint.local) + repr(adapter.endpoint.local.workers) for t in tokens)
    used = set()
    for seed in range(3):  # a single env's episodes go round the workers
        env.reset(seed=seed)
        used |= {pid for pid, _ in served([env.step(burn())[0]])}
    assert used == set(pids)
    env.close()
    assert wait_dead(pids) == [] and not any(f.exists() for f in folders)


LAUNCH = textwrap.dedent("""
    import sys, time, gymnasium as gym, openenv_gym
    envs = gym.make_vec("openenv/ORS-v0", num_envs=2, source=sys.argv[2], env_class="CpuBurn", server_workers=2)
    envs.reset(seed=0)
    print(*envs.adapters[0].server_pids(), flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
""")


@pytest.mark.parametrize("how", ["exit", "SIGKILL"])
def test_workers_stop_with_their_trainer_without_close(how):
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "exit" if how == "exit" else "wait", BURN],
                            stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, f"launcher printed {pids!r}"
        if how == "SIGKILL":
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
        assert wait_dead(pids) == [], f"workers outlived their trainer ({how})"
    finally:
        proc.kill()
        proc.wait(10)
