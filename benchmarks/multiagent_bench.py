"""Many two-seat games at once: openenv_gym's game vector env against verifiers' own rollout.

Both sides play the same hands of verifiers' own ``kuhn_poker_v1`` (two seats taking turns; the
``null`` harness in the subprocess runtime, resolved as the package resolves it), ``--games``
at once, every seat answered by the same fixed strategy:

* **library**: ``Env.run_episode`` of each hand, ``--games`` concurrently, under ``Env.serving()``,
  the model a scripted OpenAI-compatible stub on 127.0.0.1 (``openenv_gym.testing.openai_stub``);
* **ours**: :func:`openenv_gym.multiagent.vector_env` with ``--games`` slots, first-ready
  ``send``/``recv``, the strategy answering in the calling thread.

Figures, as ratios ours / library in the same round (sides alternate; medians of rounds):

* ``games_ratio``: games per second (``seat_steps_ratio`` follows it: the same moves per game);
* ``cpu_ratio``: this process's CPU per seat-step of the game vector env, against the
  single-agent vector env's CPU per env-step (``gym.make_vec`` of the v1 test taskset
  ``vf1_arith``, the same harness, the same number of sub-envs): what a seat-step costs the
  trainer's process beyond an ordinary step (the harness programs' own CPU is not counted on
  either side).

    python benchmarks/multiagent_bench.py [--games 64] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import openenv_gym  # noqa: F401 - registers the ids
from openenv_gym import runtime
from openenv_gym.adapters.verifiers import v1 as v1mod
from openenv_gym.adapters.verifiers.process import importable
from openenv_gym.multiagent import vector_env
from openenv_gym.testing.openai_stub import OpenAIStub

ENVS = Path(__file__).resolve().parent.parent / "tests" / "envs" / "verifiers_v1"
KUHN, ARITH = Path(openenv_gym.__file__).parent / "examples" / "kuhn_poker_v1", ENVS / "vf1_arith"


def move(messages: list[dict[str, Any]]) -> str:
    """Bet or call with a king, check with a queen and call a bet with it, fold a jack to a bet."""
    seen = "\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))
    card = re.search(r"Your private card: ([JQK])", seen)[1]  # type: ignore[index]
    legal = re.findall(r"Your legal actions: (.*)\.", seen)[-1]
    if "[bet]" in legal:
        return "[bet]" if card == "K" else "[check]"
    return "[call]" if card in "KQ" else "[fold]"


def children_cpu() -> float:
    """CPU seconds of this process's finished children (the seats' harness programs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def library(games: int, hands: list[int]) -> tuple[float, int]:
    """The library's own episodes of ``hands``, ``games`` at once: (seconds, seat-steps)."""
    import verifiers.v1 as vf

    async def run() -> tuple[float, int]:
        seat = {"runtime": {"type": "subprocess"}, "harness": v1mod._held_to_pins({"id": "null"}, local=True)}
        config = vf.resolve_env_config({"taskset": {"id": "kuhn_poker_v1"}, "player0": seat, "player1": seat})
        env = await asyncio.to_thread(vf.load_environment, config)
        tasks = [t for _, t in zip(range(max(hands) + 1), env.taskset)]
        with OpenAIStub(lambda body: {"role": "assistant", "content": move(body["messages"])}) as stub:
            ctx = vf.ModelContext(model="stub", client=vf.EvalClientConfig(base_url=stub.url, api_key_var="NO_SUCH_KEY"))
            async with env.serving():
                gate = asyncio.Semaphore(games)

                async def one(i: int) -> int:
                    async with gate:
                        episode = await env.run_episode(tasks[i], ctx)
                    assert episode.ok, episode.errors
                    return sum(t.num_turns for t in episode.traces)

                start = time.perf_counter()
                steps = await asyncio.gather(*(one(i) for i in hands))
                return time.perf_counter() - start, sum(steps)

    return runtime.submit(run()).result(3600)


def ours(env: Any, games: int, hands: list[int]) -> tuple[float, int, float]:
    """The same hands through the game vector env: (seconds, seat-steps, this process's CPU seconds)."""
    start, cpu = time.perf_counter(), time.process_time()
    # kuhn's taskset is endless: a reset with seed s deals hands s, s+1, ... to the slots in turn.
    ready = env.reset(seed=hands[0])
    history: dict[tuple[int, str], list] = {}
    steps = finished = 0
    while True:
        actions = {}
        for r in ready:
            key = (r.game, r.seat)
            if r.terminated or r.truncated:
                finished += 1
                history.pop(key, None)
                continue
            seen = history.setdefault(key, [])
            seen += r.observation
            actions[key] = move(seen)
            seen.append({"role": "assistant", "content": actions[key]})
        if finished == len(hands) * 2:
            break
        steps += len(actions)
        ready = env.step(actions) if actions else env.recv()
    return time.perf_counter() - start, steps, time.process_time() - cpu


class SingleAgent:
    """The baseline of the CPU figure: the single-agent vector env (vf1_arith, one model call per
    episode), built and warmed up once, so a round measures steady steps, not start-up."""

    ANSWERS = {"What is 2 + 3?": "5", "What is 6 * 7?": "42", "What is 10 - 4?": "6"}

    def __init__(self, num_envs: int):
        # Same-step autoreset: every step answers a model call (no reset-only steps to dilute the figure).
        self.envs = gym.make_vec("openenv/Verifiers-v0", num_envs=num_envs, source=str(ARITH),
                                 autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.num_envs = num_envs
        self.obs, _ = self.envs.reset(seed=0)
        self.cpu_per_step(num_envs)  # warm-up: the harness's environment, lazy imports, first connections

    def cpu_per_step(self, steps: int) -> float:
        """CPU seconds of this process per env-step over at least ``steps`` env-steps."""
        done = 0
        cpu = time.process_time()
        while done < steps:
            actions = [self.ANSWERS.get(o[-1]["content"], "0") if o else "0" for o in self.obs]
            self.obs, *_ = self.envs.step(actions)
            done += self.num_envs
        return (time.process_time() - cpu) / done

    def close(self) -> None:
        self.envs.close()


def bench(games: int, rounds: int, hands_per_round: int) -> dict[str, Any]:
    env = vector_env("openenv/Verifiers-v0", games, source=str(KUHN), autoreset=False)
    baseline = SingleAgent(min(games, 64))
    rows = []
    try:
        ours(env, games, list(range(1000, 1000 + games)))  # warm-up: the harness's environment, imports
        for r in range(rounds):
            hands = list(range(r * hands_per_round, (r + 1) * hands_per_round))
            before = children_cpu()
            lib_s, lib_steps = library(games, hands)
            lib_children, before = children_cpu() - before, children_cpu()
            our_s, our_steps, our_cpu = ours(env, games, hands)
            our_children = children_cpu() - before
            single = baseline.cpu_per_step(our_steps)  # as many steps as the games took
            rows.append({"library_games_per_s": len(hands) / lib_s, "games_per_s": len(hands) / our_s,
                         "library_seat_steps_per_s": lib_steps / lib_s, "seat_steps_per_s": our_steps / our_s,
                         "games_ratio": lib_s / our_s, "seat_steps_ratio": (our_steps / our_s) / (lib_steps / lib_s),
                         "cpu_per_seat_step_ms": our_cpu / our_steps * 1e3,
                         "single_cpu_per_step_ms": single * 1e3, "cpu_ratio": (our_cpu / our_steps) / single,
                         "library_harness_cpu_per_game_s": lib_children / len(hands),
                         "harness_cpu_per_game_s": our_children / len(hands)})
            print(f"round {r}: {rows[-1]}", file=sys.stderr)
    finally:
        env.close()
        baseline.close()
    keys = rows[0].keys()
    result = {"games": games, "hands_per_round": hands_per_round, "rounds": rows,
              **{k: statistics.median(row[k] for row in rows) for k in keys}}
    print(f"kuhn_poker_v1, {games} games at once, {hands_per_round} hands x {rounds} rounds (null harness, subprocess)")
    print(f"  games/s      : library {result['library_games_per_s']:.2f}, ours {result['games_per_s']:.2f} "
          f"-> {result['games_ratio']:.2f}x")
    print(f"  seat-steps/s : library {result['library_seat_steps_per_s']:.2f}, ours {result['seat_steps_per_s']:.2f} "
          f"-> {result['seat_steps_ratio']:.2f}x")
    print(f"  client CPU   : {result['cpu_per_seat_step_ms']:.2f} ms per seat-step vs {result['single_cpu_per_step_ms']:.2f} "
          f"ms per single-agent step -> {result['cpu_ratio']:.2f}x")
    print(f"  harness CPU  : library {result['library_harness_cpu_per_game_s']:.2f} s per game, ours "
          f"{result['harness_cpu_per_game_s']:.2f} s (the seats' programs, one launched per turn: where both sides' "
          "time goes)")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hands", type=int, default=64, help="hands per round and side")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from figures import figure, write

    with importable(ENVS), importable(KUHN.parent):
        result = bench(args.games, args.rounds, args.hands)
    rows = result["rounds"]
    write(args.json, [
        figure(f"multi-agent: kuhn games/s, {args.games} at once, vs verifiers' own rollout",
               [r["games_ratio"] for r in rows], target=1.0),
        figure("multi-agent: client CPU per seat-step vs single-agent vector env per step",
               [r["cpu_ratio"] for r in rows], target=1.2, higher_is_better=False),
    ], result)


if __name__ == "__main__":
    main()
