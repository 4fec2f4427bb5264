"""SessionPool: sessions of one id leased on demand, over the shards a vector env uses.

Real servers: the bundled Arithmetic env and the ors-sdk probe (tests/envs/ors_probe.py), launched
locally; a Ray cluster is not needed here (the pool drives any backend through the same shards).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from pathlib import Path

import gymnasium as gym
import pytest

import openenv_gym  # noqa: F401
from openenv_gym import runtime
from openenv_gym.actions import parse_action
from openenv_gym.errors import CapacityReached, ConcurrentUse, EpisodeNotStarted, TaskNotFound
from openenv_gym.pool import SessionPool
from openenv_gym.testing import procs

ENVS = Path(__file__).parent / "envs"
PROBE = dict(source=str(ENVS / "ors_probe.py"), env_class="Probe")


def call(name: str, args: dict | None = None) -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": name, "arguments": json.dumps(args or {})}}]}


def answer_of(text: str) -> str:
    expr = text.split("Compute ", 1)[1].split(". ", 1)[0]
    return str(eval(expr))  # the bundled task's own arithmetic, +-* on small ints


@pytest.fixture
def pool():
    pool = SessionPool.make("openenv/Arithmetic-v0", 4)
    yield pool
    pool.close()


def test_a_slot_plays_an_episode_exactly_as_gym_make_does(pool):
    env = gym.make("openenv/Arithmetic-v0")
    try:
        async def play():
            slot = pool.lease()
            obs, info = await slot.reset(seed=3)
            out = await slot.step(call("submit", {"answer": answer_of(obs[0]["content"])}))
            await slot.release()
            return obs, info, out

        obs, info, (obs2, reward, terminated, truncated, _) = runtime.run_sync(play(), 60)
        ref_obs, ref_info = env.reset(seed=3)
        assert obs == ref_obs and info["task_id"] == ref_info["task_id"]
        assert reward == 1.0 and terminated and not truncated
        assert [t.name for t in pool.tools] == ["calculator", "submit"]
        assert runtime.run_sync(pool.num_tasks("train"), 30) == env.unwrapped.num_tasks("train")
        assert runtime.run_sync(pool.task("train", 5), 30) == env.unwrapped.task("train", 5)
        with pytest.raises(TaskNotFound):
            runtime.run_sync(pool.lease().reset(options={"index": 10**6}), 30)
    finally:
        env.close()


def test_slots_are_leased_up_to_the_size_and_given_back(pool):
    slots = [pool.lease() for _ in range(4)]
    with pytest.raises(CapacityReached, match="all 4 sessions"):
        pool.lease()
    runtime.run_sync(slots[0].release(), 30)
    again = pool.lease()
    assert again.env_id == slots[0].env_id and pool.free == 0
    with pytest.raises(EpisodeNotStarted):
        runtime.run_sync(again.step("hello"), 30)


def test_many_threads_drive_their_own_slots_at_once(pool):
    rewards: list[float] = []
    errors: list[BaseException] = []

    def player(seed: int) -> None:
        try:
            slot = pool.lease()
            obs, _ = runtime.run_sync(slot.reset(seed=seed), 60)
            out = runtime.run_sync(slot.step(call("submit", {"answer": answer_of(obs[0]["content"])})), 60)
            rewards.append(out[1])
            runtime.run_sync(slot.release(), 60)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=player, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and rewards == [1.0] * 4


def test_one_call_at_a_time_per_slot():
    pool = SessionPool.make("openenv/ORS-v0", 1, **PROBE)
    try:
        slot = pool.lease()

        async def two_at_once():
            await slot.reset(seed=0)
            slow = asyncio.ensure_future(slot.step(call("slow", {"seconds": 1.0})))
            await asyncio.sleep(0.2)
            with pytest.raises(ConcurrentUse):
                await slot.step(call("hint"))
            return await slow

        runtime.run_sync(two_at_once(), 60)
    finally:
        pool.close()


def test_a_call_its_caller_gives_up_on_stops_at_once_and_the_next_reset_recovers():
    # A served client that leaves mid-call cancels its session's call: the op stops with it (an
    # in-process shard runs it in the caller's own task), and the session plays on after a reset.
    pool = SessionPool.make("openenv/ORS-v0", 1, **PROBE)
    try:
        slot = pool.lease()

        async def leave_mid_call() -> float:
            await slot.reset(seed=0)
            slow = asyncio.ensure_future(slot.step(call("slow", {"seconds": 30.0})))
            await asyncio.sleep(0.3)
            began = asyncio.get_running_loop().time()
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            return asyncio.get_running_loop().time() - began

        assert runtime.run_sync(leave_mid_call(), 60) < 5.0
        obs, _ = runtime.run_sync(slot.reset(seed=1), 60)
        assert "What is" in obs[0]["content"]
        _, _, _, _, info = runtime.run_sync(slot.step(call("hint")), 60)
        assert info["calls"][0]["ok"] and "error" not in info
    finally:
        pool.close()


class SeenActions(gym.Wrapper):
    """Records every action its env is stepped with (the sub-envs run in this process)."""

    seen: list = []

    def step(self, action):
        SeenActions.seen.append(action)
        return self.env.step(action)


def test_wrappers_take_the_action_as_written_when_the_caller_parsed_it_too():
    # A served session parses each call to check it and passes the turn along, so the session
    # need not parse it again; a wrapper stack must still get what the client sent.
    pool = SessionPool.make("openenv/Arithmetic-v0", 1, env_wrappers=[SeenActions])
    try:
        slot = pool.lease()
        obs, _ = runtime.run_sync(slot.reset(seed=0), 60)
        action = call("submit", {"answer": answer_of(obs[0]["content"])})
        SeenActions.seen.clear()
        _, reward, terminated, _, _ = runtime.run_sync(slot.step(action, parse_action(action)), 60)
        assert SeenActions.seen == [action]
        assert terminated and reward == 1.0
    finally:
        pool.close()


def test_a_dead_server_fails_the_call_typed_and_the_next_reset_recovers():
    pool = SessionPool.make("openenv/ORS-v0", 2, **PROBE)
    try:
        slot = pool.lease()
        runtime.run_sync(slot.reset(seed=0), 60)
        (adapter,) = pool.blocks[0].adapters  # the in-process shard's one adapter
        os.kill(adapter.server_pid(), signal.SIGKILL)
        with pytest.raises(ConnectionError):
            runtime.run_sync(slot.step(call("hint")), 60)
        obs, _ = runtime.run_sync(slot.reset(seed=1), 60)  # recreated, on a relaunched server
        assert "What is" in obs[0]["content"]
    finally:
        pool.close()


def test_close_leaves_no_server_and_refuses_more_work():
    before = set(procs.descendants())
    pool = SessionPool.make("openenv/ORS-v0", 2, **PROBE)
    slot = pool.lease()
    runtime.run_sync(slot.reset(seed=0), 60)
    started = set(procs.descendants()) - before
    assert started, "the probe source runs a local server"
    pool.close()
    pool.close()  # idempotent
    assert procs.wait_dead(started, timeout=20) == []
    with pytest.raises(ValueError, match="closed"):
        pool.lease()


def test_a_pool_without_a_size_grows_by_blocks_that_share_one_server():
    before = set(procs.descendants())
    with SessionPool("openenv/ORS-v0", block=2, **PROBE) as pool:
        slots = [pool.lease() for _ in range(5)]
        assert pool.capacity == 6 and len(pool.blocks) == 3
        assert sorted(s.env_id for s in slots) == [0, 1, 2, 3, 4]

        async def play(slot):
            obs, _ = await slot.reset(seed=slot.env_id)
            return (await slot.step(call("hint")))[0][0]["content"]

        async def every():
            return await asyncio.gather(*(play(s) for s in slots))

        assert runtime.run_sync(every(), 120) == ["Think step by step."] * 5
        servers = set(procs.descendants()) - before
        assert len({a.server_pid() for b in pool.blocks for a in b.adapters}) == 1, "one server for every block"
    assert procs.wait_dead(servers, timeout=20) == []
