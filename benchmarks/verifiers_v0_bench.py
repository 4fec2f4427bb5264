"""Per-step overhead of the legacy (v0) Verifiers adapter against the library's own rollout loop.

Both sides play the same scripted episodes of the same loaded environment (the ToolEnv test
fixture ``tests/envs/verifiers_v0/vf_calc_tool.py``: a ``multiply`` tool call, then the answer):

* **library**: ``env.run_rollout(row, client, ...)`` with a scripted ``vf.Client`` that answers
  each model call at once: the loop, the tool call, the rubric, ``state_to_output``; nothing of ours;
* **episode**: the adapter's :class:`VerifiersV0Episode` driven on the runtime loop (the same
  library loop, plus the queue client, the action -> ``vf.Response`` conversion and the
  observation diff): the adapter's own cost;
* **gym**: ``AgentEnv.reset/step`` from the calling thread (adds the Gymnasium layer: action
  parsing and one hop to the runtime loop per call).

Sides alternate in rounds, each round in a turned order (the machine is shared and noisy); the
figures are medians of per-round ratios of steps per second, side / library (1.0 = no overhead).

    python benchmarks/verifiers_v0_bench.py [--reps 5] [--episodes 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from openenv_gym import runtime
from openenv_gym.actions import parse_action
from openenv_gym.adapters.verifiers.v0 import VerifiersV0Adapter
from openenv_gym.env import AgentEnv
from openenv_gym.wire import TaskRef

SOURCE = Path(__file__).resolve().parent.parent / "tests" / "envs" / "verifiers_v0" / "vf_calc_tool.py"
FACTORS = {0: (12, 13), 1: (7, 8)}


def _actions(index: int) -> list[Any]:
    a, b = FACTORS[index]
    return [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "multiply", "arguments": json.dumps({"a": a, "b": b})}}]},
        str(a * b)]


_scripted: type | None = None


def _scripted_client(actions: list[Any]) -> Any:
    """A ``vf.Client`` answering each model call with the next of ``actions`` at once (the class is
    built once, as a user's client class would be; only an instance per episode)."""
    global _scripted
    if _scripted is None:
        import verifiers as vf

        class Scripted(vf.Client):
            def __init__(self, actions: list[Any]) -> None:
                super().__init__(None)
                self.actions = actions

            def setup_client(self, config): return None
            async def to_native_tool(self, tool): return tool
            async def to_native_prompt(self, messages): return messages, {}
            async def get_native_response(self, *a, **k): raise NotImplementedError
            async def raise_from_native_response(self, response): return None
            async def from_native_response(self, response): return response
            async def close(self): return None

            async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs):
                action = self.actions.pop(0)
                if isinstance(action, str):
                    message = vf.ResponseMessage(content=action, finish_reason="stop", is_truncated=False)
                else:
                    c = action["tool_calls"][0]
                    message = vf.ResponseMessage(
                        content=None, finish_reason="tool_calls", is_truncated=False,
                        tool_calls=[vf.ToolCall(id=c["id"], name=c["function"]["name"],
                                                arguments=c["function"]["arguments"])])
                return vf.Response(id="bench", created=0, model=model, message=message)

        _scripted = Scripted
    return _scripted(list(actions))


async def _library(adapter: VerifiersV0Adapter, rows: list[dict], episodes: int) -> tuple[int, float, float]:
    steps, total = 0, 0.0
    actions = [_actions(i) for i in range(len(rows))]  # made once, as the other sides' are
    start = time.perf_counter()
    for n in range(episodes):
        i = n % len(rows)
        out = await adapter.env.run_rollout(rows[i], _scripted_client(actions[i]), adapter.model,
                                            dict(adapter.sampling_args))
        steps, total = steps + 2, total + out["reward"]
    return steps, time.perf_counter() - start, total


async def _episodes(adapter: VerifiersV0Adapter, episodes: int) -> tuple[int, float, float]:
    steps, total = 0, 0.0
    turns = {i: [parse_action(a) for a in _actions(i)] for i in FACTORS}  # parsing is the gym side's
    start = time.perf_counter()
    for n in range(episodes):
        i = n % len(FACTORS)
        episode = adapter.episode()
        await episode.start(TaskRef(split="train", index=i))
        await episode.step(turns[i][0])
        outcome = await episode.step(turns[i][1])
        await episode.aclose()
        steps, total = steps + 2, total + outcome.reward
    return steps, time.perf_counter() - start, total


def _gym(env: AgentEnv, episodes: int) -> tuple[int, float, float]:
    steps, total = 0, 0.0
    actions = {i: _actions(i) for i in FACTORS}
    start = time.perf_counter()
    for n in range(episodes):
        i = n % len(FACTORS)
        env.reset(options={"index": i})
        env.step(actions[i][0])
        _, reward, terminated, _, _ = env.step(actions[i][1])
        assert terminated
        steps, total = steps + 2, total + float(reward)
    return steps, time.perf_counter() - start, total


def bench_v0(reps: int = 5, episodes: int = 200, source: str | Path = SOURCE) -> dict[str, Any]:
    """Run ``reps`` alternating rounds of ``episodes`` episodes per side; print and return the ratios."""
    env = AgentEnv(VerifiersV0Adapter(source=str(source)))
    adapter = env.adapter
    assert isinstance(adapter, VerifiersV0Adapter)
    rows = [env.task("train", i) for i in FACTORS]
    rounds: list[dict[str, Any]] = []
    try:
        # warm-up: imports, pools, pydantic schemas
        runtime.run_sync(_library(adapter, rows, 10))
        runtime.run_sync(_episodes(adapter, 10))
        _gym(env, 10)
        sides = {"library": lambda: runtime.run_sync(_library(adapter, rows, episodes)),
                 "episode": lambda: runtime.run_sync(_episodes(adapter, episodes)),
                 "gym": lambda: _gym(env, episodes)}
        for k in range(reps):
            # The order turns each round, so that no side always runs first (or last) in a round.
            order = list(sides)[k % 3:] + list(sides)[:k % 3]
            got = {name: sides[name]() for name in order}
            lib, epi, gym_ = got["library"], got["episode"], got["gym"]
            assert lib[2] == epi[2] == gym_[2] == episodes, (lib, epi, gym_)  # every episode won
            rate = {name: s / t for name, (s, t, _) in (("library", lib), ("episode", epi), ("gym", gym_))}
            rounds.append({**{f"{k}_steps_per_s": v for k, v in rate.items()},
                           "episode_ratio": rate["episode"] / rate["library"],
                           "gym_ratio": rate["gym"] / rate["library"]})
    finally:
        env.close()
    result = {
        "episodes_per_round": episodes,
        "rounds": rounds,
        "library_steps_per_s": statistics.median(r["library_steps_per_s"] for r in rounds),
        "episode_ratio": statistics.median(r["episode_ratio"] for r in rounds),
        "gym_ratio": statistics.median(r["gym_ratio"] for r in rounds),
    }
    lib_us = 1e6 / result["library_steps_per_s"]
    print(f"verifiers v0, {episodes} two-step ToolEnv episodes x {reps} rounds")
    print(f"  library run_rollout : {result['library_steps_per_s']:8.0f} steps/s ({lib_us:.0f} us/step)")
    print(f"  adapter episode     : ratio {result['episode_ratio']:.2f} "
          f"(+{lib_us * (1 / result['episode_ratio'] - 1):.0f} us/step)")
    print(f"  AgentEnv (sync gym) : ratio {result['gym_ratio']:.2f} "
          f"(+{lib_us * (1 / result['gym_ratio'] - 1):.0f} us/step)")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from figures import figure, write

    result = bench_v0(args.reps, args.episodes)
    rounds = result["rounds"]
    write(args.json, [
        figure("Verifiers v0: adapter episode vs the library's own rollout", [r["episode_ratio"] for r in rounds],
               target=0.95),
        figure("Verifiers v0: AgentEnv.step vs the library's own rollout", [r["gym_ratio"] for r in rounds],
               target=0.90),
    ], result)


if __name__ == "__main__":
    main()
