"""RayVectorEnv on a real two-node Ray cluster: ``ray start`` twice on this machine, joined by address.

A head node (1 CPU) and a worker node (1 CPU and a custom resource ``gpu_box``), each a
``ray start --block`` subprocess with a loopback address of its own
(:mod:`openenv_gym.testing.ray_cluster`, which ``benchmarks/scale.py`` starts too); the cluster
requires a token, generated here for this run. The tests join the
cluster with ``vector_options={"address": ...}`` as a user on a real cluster would, pin the actors
to the worker through the resource, run isolated hosts there, and kill an actor mid-episode.
Teardown stops both nodes by PID and checks that none of their processes is left.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import gymnasium as gym
import numpy as np
import pytest

from openenv_gym.errors import ConfigurationError
from openenv_gym.testing import procs
from openenv_gym.testing.ray_cluster import Cluster, cluster_env

ray = pytest.importorskip("ray")

import openenv_gym  # noqa: E402,F401

pytestmark = pytest.mark.slow  # a two-node cluster of its own: its own CI step (-m slow)

ARITH = "openenv/Arithmetic-v0"


def call(name, args):
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": name, "arguments": json.dumps(args)}}]}


def reload_auth() -> None:
    """Make this process's Ray read ``RAY_AUTH_MODE`` and the token again (it caches both)."""
    from ray._private.authentication import authentication_token_setup as auth

    auth.Config.initialize("")
    auth.AuthenticationTokenLoader.instance().reset_cache()


@pytest.fixture(scope="module")
def cluster():
    assert not ray.is_initialized()
    patch = pytest.MonkeyPatch()
    # Linux allows multi-node clusters unless told otherwise: a local Ray started by an earlier
    # test of this process may have said so for its single-node cluster. The token is this run's.
    for key, value in cluster_env().items():
        patch.setenv(key, value)
    patch.delenv("RAY_ADDRESS", raising=False)
    patch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", True)
    reload_auth()  # this process imported Ray (and read its auth mode) before the token existed
    c = None
    try:
        c = Cluster(dict(os.environ), worker_resources='{"gpu_box": 4}')
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        patch.undo()
        reload_auth()
        left = c.stop() if c is not None else []
        assert not left, f"processes left after stopping the nodes: {[(p, procs.cmdline(p)) for p in left]}"


PINNED = {"resources": {"gpu_box": 1}}


def make(cluster, n=4, **kwargs):
    options = {"address": cluster.address, "num_actors": 2, "actor_options": PINNED, **kwargs.pop("vector_options", {})}
    return gym.make_vec(ARITH, num_envs=n, backend="ray", vector_options=options, **kwargs)


def on_worker(cluster, pids) -> bool:
    worker_tree = set(procs.descendants(cluster.worker.pid))
    return all(p in worker_tree for p in pids)


def play(envs, n):
    obs, infos = envs.reset(seed=0)
    expressions = [o[-1]["content"].split("Compute ", 1)[1].split(". ", 1)[0] for o in obs]
    obs, rewards, terminated, truncated, infos = envs.step([call("calculator", {"expression": e}) for e in expressions])
    assert not truncated.any() and "error" not in infos
    answers = [o[0]["content"] for o in obs]
    _, rewards, terminated, truncated, _ = envs.step([call("submit", {"answer": a}) for a in answers])
    np.testing.assert_array_equal(rewards, np.ones(n))
    assert terminated.all()


def test_actors_pinned_by_a_resource_run_on_the_worker_node_and_play(cluster):
    envs = make(cluster)
    try:
        assert ray.is_initialized() and len([x for x in ray.nodes() if x["Alive"]]) == 2
        pids = ray.get([a.pid.remote() for a in envs.actors])
        assert len(set(pids)) == 2 and on_worker(cluster, pids)
        play(envs, 4)
    finally:
        envs.close()
    assert not ray.is_initialized()  # the env joined the cluster, so it leaves it (the nodes stay up)
    assert cluster.head.poll() is None and cluster.worker.poll() is None


def test_without_the_resource_actors_may_land_on_the_head_and_a_missing_resource_fails_within_30_s(cluster):
    envs = make(cluster, n=2, vector_options={"actor_options": {"num_cpus": 1}, "num_actors": 2})
    try:  # one CPU per node, one CPU per actor: one actor on each node
        pids = ray.get([a.pid.remote() for a in envs.actors])
        head_tree = set(procs.descendants(cluster.head.pid))
        assert sum(p in head_tree for p in pids) == 1 and sum(on_worker(cluster, [p]) for p in pids) == 1
        play(envs, 2)
    finally:
        envs.close()
    start = time.monotonic()
    with pytest.raises(ConfigurationError, match="no node of the Ray cluster offers .*gpu_bx.*gpu_box"):
        make(cluster, vector_options={"actor_options": {"resources": {"gpu_bx": 1}}})
    assert time.monotonic() - start < 30 and not ray.is_initialized()


def test_isolated_hosts_run_on_the_node_of_their_actor(cluster):
    envs = make(cluster, python=sys.executable)
    try:
        envs.reset(seed=0)
        hosts = ray.get([a.host_pid.remote() for a in envs.actors])
        assert all(hosts) and on_worker(cluster, hosts)
        assert all(procs.cmdline(p).split()[:3] == [sys.executable, "-m", "openenv_gym.hosts.server"] for p in hosts)
        play(envs, 4)
        tree = hosts + [c for h in hosts for c in procs.descendants(h)]
    finally:
        envs.close()
    assert procs.wait_dead(tree, timeout=20) == []


def test_killing_an_actor_on_the_worker_mid_episode_fails_its_sub_envs_and_recovers(cluster):
    envs = make(cluster)
    try:
        envs.reset(seed=1)
        victim = ray.get(envs.actors[0].pid.remote())  # sub-envs 0 and 2
        os.kill(victim, signal.SIGKILL)
        start = time.monotonic()
        _, _, _, truncated, infos = envs.step([call("calculator", {"expression": "1+1"})] * 4)
        assert time.monotonic() - start < 60
        np.testing.assert_array_equal(truncated, [True, False, True, False])
        assert infos["error"]["type"][0] == "ActorDiedError" and "replaced" in infos["error"]["message"][0]
        assert envs.replaced_actors == 1
        play(envs, 4)  # the replacement, pinned to the worker too
        assert on_worker(cluster, ray.get([a.pid.remote() for a in envs.actors]))
    finally:
        envs.close()
