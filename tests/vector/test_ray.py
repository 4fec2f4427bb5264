"""RayVectorEnv on a real local Ray cluster: parity with ConcurrentVectorEnv, send/recv, dead actors, close.

One module-scoped cluster (2 CPUs, no dashboard) serves every test; its teardown checks that no
Ray process (nor any server started inside an actor) outlives ``ray.shutdown()``. The module is
skipped only when ``ray`` is not importable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from openenv_gym.testing import procs

ray = pytest.importorskip("ray")

import openenv_gym  # noqa: E402,F401
from openenv_gym.shard.handle import HUNG_GRACE, PING_TIMEOUT  # noqa: E402
from openenv_gym.vector import ConcurrentVectorEnv  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1]))
from conftest import pid_alive  # noqa: E402

pytestmark = pytest.mark.ray  # local Ray clusters, seconds each: their own CI step (-m ray)

ARITH = "openenv/Arithmetic-v0"
# No usage stats, no auth token file in $HOME, and loopback only: on Linux Ray binds its head to
# the machine's own IP unless it thinks it is a single-machine (Windows/macOS-style) cluster.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
COMPARED_INFO = ("task_id", "index", "split", "turn")


# -- helpers ---------------------------------------------------------------------------------------
def call(name, args):
    return {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": name, "arguments": json.dumps(args)}}]}


def scripted(obs_batch, t):
    """A deterministic policy of the observations: calculator, then submit (right or wrong)."""
    actions = []
    for i, obs in enumerate(obs_batch):
        last = obs[-1] if obs else {"role": "user", "content": ""}
        if last["role"] == "tool" and last.get("name") == "calculator":
            actions.append(call("submit", {"answer": last["content"] if (i + t) % 3 else "-1"}))
        elif "Compute " in str(last.get("content")):
            expr = last["content"].split("Compute ", 1)[1].split(". ", 1)[0]
            actions.append(call("calculator", {"expression": expr}) if (i + t) % 4 else call("submit", {"answer": "0"}))
        else:
            actions.append(call("calculator", {"expression": "1+1"}))
    return actions


def compare_infos(ours, theirs, n):
    for key in COMPARED_INFO:
        assert (key in ours) == (key in theirs), key
        if key in ours:
            np.testing.assert_array_equal(ours[f"_{key}"], theirs[f"_{key}"])
            mask = ours[f"_{key}"]
            np.testing.assert_array_equal(np.asarray(ours[key])[mask], np.asarray(theirs[key])[mask])
    for key in ("final_obs", "_final_obs", "_final_info", "error"):
        assert (key in ours) == (key in theirs), key
    if "final_obs" in ours:
        np.testing.assert_array_equal(ours["_final_obs"], theirs["_final_obs"])
        for i in range(n):
            if ours["_final_obs"][i]:
                assert ours["final_obs"][i] == theirs["final_obs"][i]
                assert ours["final_info"]["turn"][i] == theirs["final_info"]["turn"][i]


children, descendants, cmdline = procs.children, procs.descendants, procs.cmdline


def server_pids(actor_pid):
    """The ORS servers an actor launched (children of its worker process)."""
    return [p for p in children(actor_pid) if "local_servers/serve.py" in cmdline(p)]


def wait_dead(pids, timeout=15.0):
    return procs.wait_dead(pids, timeout)


def actor_pids(envs):
    return ray.get([a.pid.remote() for a in envs.actors])


def make(n=4, **kwargs):
    options = {"num_actors": 2, **kwargs.pop("vector_options", {})}
    return gym.make_vec(ARITH, num_envs=n, backend="ray", vector_options=options, **kwargs)


# -- Ray itself: optional, and owned by the env when the caller did not start it -------------------
def test_importing_the_vector_package_does_not_import_ray_and_a_missing_ray_is_explained():
    code = textwrap.dedent("""
        import sys
        import openenv_gym, openenv_gym.vector
        assert "ray" not in sys.modules, "importing openenv_gym.vector imported ray"
        sys.modules["ray"] = None  # as if ray were not installed
        from openenv_gym.errors import ConfigurationError
        try:
            openenv_gym.vector.make(2, None, backend="ray")
        except ConfigurationError as exc:
            assert "pip install 'openenv-gym[ray]'" in str(exc), exc
        else:
            raise AssertionError("no ConfigurationError")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_an_env_that_starts_ray_shuts_it_down_on_close():
    # In a fresh interpreter (this module's cluster must not be running there): the default
    # path of gym.make_vec(..., backend="ray") when the user never called ray.init().
    code = textwrap.dedent("""
        import os, sys, time
        import gymnasium as gym, ray, openenv_gym
        envs = gym.make_vec("openenv/Arithmetic-v0", num_envs=2, backend="ray", vector_options={"num_actors": 1})
        obs, _ = envs.reset(seed=0)
        assert obs[0][0]["content"].startswith("Compute "), obs
        assert ray.is_initialized() and ray.util.get_node_ip_address() == "127.0.0.1"
        def tree(pid):
            parents = {}
            for e in os.listdir("/proc"):
                if e.isdigit():
                    try:
                        parents[int(e)] = int(open(f"/proc/{e}/stat").read().rsplit(")", 1)[1].split()[1])
                    except (OSError, IndexError, ValueError):
                        pass
            out, todo = [], [pid]
            while todo:
                p = todo.pop()
                kids = [c for c, pp in parents.items() if pp == p]
                out += kids; todo += kids
            return out
        before = tree(os.getpid())
        assert before, "ray.init() started no process"
        envs.close()
        assert not ray.is_initialized(), "the env started Ray and must shut it down"
        def alive(p):
            try:
                return open(f"/proc/{p}/stat").read().split(")")[-1].split()[0] != "Z"
            except OSError:
                return False
        deadline = time.monotonic() + 20
        while any(alive(p) for p in before) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in before if alive(p)]
        assert not left, f"processes left after close: {left}"
    """)
    env = {**os.environ, **RAY_ENV}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=110, env=env)
    assert done.returncode == 0, done.stderr[-4000:]


# -- on a shared local cluster ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    patch = pytest.MonkeyPatch()
    for key, value in RAY_ENV.items():
        patch.setenv(key, value)
    # ray read RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when it was imported: tell the driver too.
    patch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
    existing = set(descendants(os.getpid()))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert ray.util.get_node_ip_address() == "127.0.0.1"
        yield
    finally:
        ours = [p for p in descendants(os.getpid()) if p not in existing]
        ray.shutdown()
        patch.undo()
        left = wait_dead(ours, 20.0)
        for pid in left:  # never leave them behind, even when failing
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        assert not left, f"Ray processes left after ray.shutdown(): {[(p, cmdline(p)) for p in left]}"


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_same_results_as_the_concurrent_vector_env(cluster, mode):
    n, steps = 4, 10
    ours = make(n, autoreset_mode=mode, max_turns=3)
    theirs = gym.make_vec(ARITH, num_envs=n, autoreset_mode=mode, max_turns=3)
    try:
        assert type(ours).__name__ == "RayVectorEnv" and isinstance(theirs, ConcurrentVectorEnv)
        assert ours.num_actors == 2
        assert ours.metadata["autoreset_mode"] == mode
        assert ours.single_action_space.tools == theirs.single_action_space.tools
        o1, i1 = ours.reset(seed=11)
        o2, i2 = theirs.reset(seed=11)
        assert list(o1) == list(o2)
        compare_infos(i1, i2, n)
        ended = 0
        for t in range(steps):
            actions = scripted(o1, t)
            o1, r1, te1, tr1, i1 = ours.step(actions)
            o2, r2, te2, tr2, i2 = theirs.step(actions)
            assert list(o1) == list(o2), f"step {t}"
            np.testing.assert_array_equal(r1, r2)
            np.testing.assert_array_equal(te1, te2)
            np.testing.assert_array_equal(tr1, tr2)
            compare_infos(i1, i2, n)
            ended += int((te1 | tr1).sum())
        assert ended > 0, "the script must end episodes so autoreset is exercised"
        assert r1.dtype == np.float64
    finally:
        ours.close()
        theirs.close()


@pytest.fixture
def envs(cluster):
    envs = make(4)
    yield envs
    envs.close()


def test_send_recv_returns_the_ids_and_results_of_what_was_sent(envs):
    obs, _ = envs.reset(seed=0)
    assert all(o[0]["content"].startswith("Compute ") for o in obs)
    envs.send([call("calculator", {"expression": "6*7"}), call("calculator", {"expression": "2+3"})], env_ids=[3, 0])
    batch = envs.recv()
    got = {int(i): o for i, o in zip(batch.env_ids, batch.obs)}
    assert sorted(got) == [0, 3]
    assert got[3][0]["content"] == "42" and got[0][0]["content"] == "5"
    assert batch.infos["turn"].tolist() == [1, 1]
    envs.send([call("calculator", {"expression": f"{i}*10"}) for i in (1, 2)], env_ids=[1, 2])
    first = envs.recv(batch_size=1)
    assert len(first.env_ids) == 1
    rest = envs.recv()
    assert sorted([*first.env_ids.tolist(), *rest.env_ids.tolist()]) == [1, 2]
    for batch in (first, rest):
        for i, o in zip(batch.env_ids, batch.obs):
            assert o[0]["content"] == str(int(i) * 10)
    # submit what the calculator said: reward 1.0
    envs.send([call("submit", {"answer": "42"})], env_ids=[3])
    done = envs.recv()
    assert done.env_ids.tolist() == [3]
    assert done.obs[0][0]["content"] in ("Correct!", "Incorrect.")
    assert done.terminations.tolist() == [True]
    assert envs.late_results == 0


def test_call_get_attr_and_set_attr(envs):
    envs.reset(seed=1)
    assert envs.call("num_tasks", "train") == (2000,) * 4
    assert envs.get_attr("max_turns") == (8,) * 4  # the registered default
    envs.set_attr("max_turns", 3)
    assert envs.get_attr("max_turns") == (3,) * 4
    envs.set_attr("split", ["train", "test", "train", "test"])
    assert envs.get_attr("split") == ("train", "test", "train", "test")
    for _ in range(3):
        _, _, terminated, truncated, _ = envs.step([call("calculator", {"expression": "1+1"})] * 4)
    assert truncated.all() and not terminated.any()
    _, infos = envs.reset(seed=2)
    assert infos["split"].tolist() == ["train", "test", "train", "test"]


def test_a_dead_actor_is_replaced_and_only_its_sub_envs_are_truncated(envs):
    obs, _ = envs.reset(seed=5)
    old = envs.actors
    pids = actor_pids(envs)
    servers = [server_pids(p) for p in pids]
    assert all(len(s) == 1 for s in servers), servers  # one ORS server per actor
    calc = [call("calculator", {"expression": "1+1"})] * 4

    for shard, kill in ((0, "ray.kill"), (1, "SIGKILL")):
        if kill == "ray.kill":
            ray.kill(envs.actors[shard])
        else:
            os.kill(pids[shard], signal.SIGKILL)
        mine = np.array([i % 2 == shard for i in range(4)])
        obs, rewards, terminated, truncated, infos = envs.step(calc)
        np.testing.assert_array_equal(infos["_error"], mine)
        np.testing.assert_array_equal(truncated, mine)
        assert not terminated.any() and not rewards.any()
        for i in np.flatnonzero(mine):
            assert obs[i] == []
            assert infos["error"]["type"][i] == "ActorDiedError"
            assert "replaced" in infos["error"]["message"][i]
        for i in np.flatnonzero(~mine):
            assert obs[i][0]["content"] == "2"
        # the step after works for every sub-env: the failed ones start new episodes
        obs, rewards, terminated, truncated, infos = envs.step(calc)
        assert "error" not in infos
        assert not truncated.any()
        for i in range(4):
            if mine[i]:
                assert obs[i][0]["content"].startswith("Compute ")
            else:
                assert obs[i][0]["content"] == "2"
        assert envs.actors[shard] is not old[shard]
        assert wait_dead([pids[shard], *servers[shard]]) == [], "the dead actor's server outlived it"

    assert envs.replaced_actors == 2
    new_pids = actor_pids(envs)
    assert not set(new_pids) & set(pids)
    assert all(len(server_pids(p)) == 1 for p in new_pids)


def test_a_sub_env_idle_when_its_actor_died_reports_the_loss_on_its_next_step(envs):
    envs.reset(seed=3)
    ray.kill(envs.actors[0])  # hosts sub-envs 0 and 2
    envs.send([call("calculator", {"expression": "1+1"})], env_ids=[0])
    first = envs.recv()
    assert first.truncations.tolist() == [True] and first.infos["error"]["type"][0] == "ActorDiedError"
    # sub-env 2 was idle: its episode died with the actor, which its next step reports
    envs.send([call("calculator", {"expression": "1+1"})], env_ids=[2])
    lost = envs.recv()
    assert lost.truncations.tolist() == [True]
    assert "episode was lost" in lost.infos["error"]["message"][0]
    assert lost.obs == ([],)
    # and both are back on their next request, as is the other actor's sub-env
    envs.send([call("calculator", {"expression": "1+1"})] * 3, env_ids=[0, 2, 1])
    back = envs.recv()
    got = {int(i): o for i, o in zip(back.env_ids, back.obs)}
    assert got[0][0]["content"].startswith("Compute ") and got[2][0]["content"].startswith("Compute ")
    assert got[1][0]["content"] == "2"
    assert envs.replaced_actors == 1


def test_close_mid_rollout_leaves_no_actor_and_no_server(cluster):
    envs = make(4)
    envs.reset(seed=0)
    handles = envs.actors
    pids = actor_pids(envs)
    servers = [s for p in pids for s in server_pids(p)]
    assert len(servers) == 2
    assert {h._actor_id.hex() for h in handles} <= alive_hosts()
    envs.send([call("calculator", {"expression": "3**3"})] * 4)  # in flight, never received
    envs.close()
    assert envs.closed
    assert wait_dead([*pids, *servers]) == []
    for handle in handles:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(handle.pid.remote(), timeout=30)
    assert not {h._actor_id.hex() for h in handles} & alive_hosts()


@pytest.mark.slow
def test_timeouts_cancel_in_the_actor_and_a_hung_actor_is_replaced(cluster):
    probe = str(Path(__file__).parents[1] / "envs" / "ors_probe.py")
    # step_timeout 3 s: the cancel of a request abandoned at 0.8 s must reach its actor before the
    # actor's own limit answers it; at 2 s, a CI step of two test workers beside Ray once took longer
    envs = gym.make_vec("openenv/ORS-v0", num_envs=2, source=probe, env_class="Probe", backend="ray",
                        step_timeout=3.0, vector_options={"num_actors": 2})
    hint = call("hint", {})
    stopped = None
    try:
        envs.reset(seed=0)
        # a slow op is bounded inside the actor: only its sub-env is truncated
        obs, _, terminated, truncated, infos = envs.step([call("slow", {"seconds": 5.0}), hint])
        assert truncated.tolist() == [True, False] and not terminated.any()
        assert infos["error"]["type"][0] == "BackendTimeout" and infos["_error"].tolist() == [True, False]
        assert obs[1][0]["content"] == "Think step by step."
        obs, *_ = envs.step([hint, hint])  # sub-env 0 comes back with a new episode
        assert "What is" in obs[0][0]["content"] and obs[1][0]["content"] == "Think step by step."

        # step_wait(timeout) bounds the whole wait (the caller's own wait on the actors included),
        # and the request it abandons is cancelled in its actor: no late reply at all
        envs.step_async([hint, call("slow", {"seconds": 5.0})])
        start = time.monotonic()
        with pytest.raises(openenv_gym.errors.BackendTimeout):
            envs.step_wait(timeout=0.8)
        assert time.monotonic() - start < 1.4  # not 0.8 s on the caller's thread, then 0.8 s more
        obs, _, _, _, infos = envs.step([hint, hint])
        assert "What is" in obs[1][0]["content"] and infos["error"]["type"][1] == "BackendTimeout"
        # only the slow sub-env was abandoned: the fast one's answer was not held back by it
        assert obs[0][0]["content"] == "Think step by step." and infos["_error"].tolist() == [False, True]
        time.sleep(3.0)  # past the step_timeout at which the abandoned op would have answered
        obs, *_ = envs.step([hint, hint])
        assert [o[0]["content"] for o in obs] == ["Think step by step."] * 2
        assert envs.late_results == 0

        # an actor that stops answering (here: stopped) is killed and replaced once it misses a
        # liveness check, asked step_timeout + HUNG_GRACE into the call
        pids = actor_pids(envs)
        stopped = pids[1]
        os.kill(stopped, signal.SIGSTOP)
        start = time.monotonic()
        obs, _, _, truncated, infos = envs.step([hint, hint])
        assert time.monotonic() - start < 3.0 + HUNG_GRACE + PING_TIMEOUT + 3
        assert truncated.tolist() == [False, True] and infos["_error"].tolist() == [False, True]
        assert infos["error"]["type"][1] == "BackendTimeout" and "replaced" in infos["error"]["message"][1]
        assert obs[0][0]["content"] == "Think step by step."
        obs, _, _, truncated, infos = envs.step([hint, hint])
        assert "What is" in obs[1][0]["content"] and not truncated.any()
        assert wait_dead([stopped]) == [], "the hung actor was not killed"
        assert envs.replaced_actors == 1
    finally:
        if stopped is not None and pid_alive(stopped):
            os.kill(stopped, signal.SIGKILL)
        envs.close()


def test_a_mixtures_ray_parts_share_the_callers_timeout(cluster):
    """``step_wait(timeout=T)`` over a mixture waits T in all: each Ray part waits on the caller's
    thread for what is left of T, not for T of its own (two slow parts once took 2T)."""
    from openenv_gym.importing import import_source
    from openenv_gym.registration import register_catalog

    probe = str(Path(__file__).parents[1] / "envs" / "ors_probe.py")
    import_source(probe, "ProbeTwin", kind="ors", env_class="Probe")
    assert "openenv/ProbeTwin-v0" in register_catalog()
    envs = openenv_gym.make_mixture({"openenv/ORS-v0": 1, "openenv/ProbeTwin-v0": 1}, backend="ray",
                                    step_timeout=3.0, vector_options={"num_actors": 1},
                                    env_kwargs={"openenv/ORS-v0": {"source": probe, "env_class": "Probe"}})
    try:
        envs.reset(seed=0)
        slow = call("slow", {"seconds": 5.0})
        envs.step_async([slow, slow])
        start = time.monotonic()
        with pytest.raises(openenv_gym.errors.BackendTimeout):
            envs.step_wait(timeout=0.8)
        assert time.monotonic() - start < 1.4  # not 0.8 s for the first part, then 0.8 s more
        obs, _, _, _, infos = envs.step([call("hint", {}), call("hint", {})])  # both were abandoned
        assert infos["_error"].tolist() == [True, True] and all("What is" in o[0]["content"] for o in obs)
    finally:
        envs.close()


def test_an_interrupted_lockstep_step_loses_no_result(cluster):
    """``step()`` waits for its actors' answers on the caller's thread; Ctrl-C there hands the
    calls to the runtime loop, so the results arrive for the next ``recv``, as after a ``recv``."""
    import threading

    probe = str(Path(__file__).parents[1] / "envs" / "ors_probe.py")
    envs = gym.make_vec("openenv/ORS-v0", num_envs=2, source=probe, env_class="Probe", backend="ray",
                        vector_options={"num_actors": 2})
    try:
        envs.reset(seed=0)
        threading.Timer(0.3, lambda: signal.pthread_kill(threading.get_ident(), signal.SIGINT)).start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            envs.step([call("slow", {"seconds": 0.8}), call("slow", {"seconds": 0.8})])
        assert time.monotonic() - start < 0.8  # seen within a wait slice, not at the step's end
        batch = envs.recv(timeout=30)
        assert sorted(batch.env_ids.tolist()) == [0, 1]
        assert [o[0]["content"] for o in batch.obs] == ["slept", "slept"]
        # and a step longer than the caller's own wait is followed up by the loop
        obs, _, _, truncated, _ = envs.step([call("slow", {"seconds": 1.5}), call("hint", {})])
        assert [o[0]["content"] for o in obs] == ["slept", "Think step by step."] and not truncated.any()
        assert envs.late_results == 0
    finally:
        envs.close()


def alive_hosts():
    return {a["ActorID"] for a in ray._private.state.actors().values()
            if a["State"] != "DEAD" and a.get("ActorClassName", "").endswith("Shard")}


def test_a_failing_start_raises_the_actors_error_and_leaves_no_actor(cluster, tmp_path):
    before = alive_hosts()
    with pytest.raises(openenv_gym.errors.SourceNotFound):
        gym.make_vec("openenv/ORS-v0", num_envs=2, source=str(tmp_path / "missing.py"), env_class="X",
                     backend="ray", vector_options={"num_actors": 2})
    assert alive_hosts() == before
    with pytest.raises(ValueError):  # a bad option fails before any actor starts
        make(2, autoreset_mode="sometimes")
    assert alive_hosts() == before


def test_malformed_actions_reach_the_agent_through_the_actors(cluster):
    """Actions cross to the actors as msgpack: every named bad action of the robustness suite
    (huge ints, lone surrogates, NaN, 100,000-deep nesting, sets, bytes...) must still arrive as a
    message to the agent, without truncating the sub-env."""
    from bad_actions import NAMED_BAD, SAYS_WHAT_WAS_WRONG  # tests/bad_actions.py

    envs = make(2, max_turns=10**6, vector_options={"num_actors": 1})
    try:
        envs.reset(seed=0)
        for action in NAMED_BAD:
            obs, rewards, terminated, truncated, infos = envs.step([action, call("calculator", {"expression": "1+1"})])
            assert not truncated.any() and not terminated.any(), infos
            assert "error" not in infos, infos.get("error")
            assert rewards.tolist() == [0.0, 0.0]
            said = " ".join(str(m.get("content")) for m in obs[0])
            assert any(phrase in said for phrase in SAYS_WHAT_WAS_WRONG), said[:300]
            assert obs[1][0]["content"] == "2"
    finally:
        envs.close()
