"""Per-step overhead of the Verifiers v1 adapter against the library's own rollout.

Both sides play the same scripted episodes of the same taskset (the test fixture
``tests/envs/verifiers_v1/vf1_calc`` with its shared tool server: ``STEPS - 1`` calls of
``calc_multiply``, then the answer), with the same harness (``null``) in the same runtime
(subprocess):

* **library**: ``vf.Agent(config).run(task)`` with a scripted ``vf.Client`` that answers each
  model call at once (injected the same way the adapter injects its queue client, so only the
  queue and the Gymnasium layer differ);
* **gym**: ``AgentEnv.reset/step`` from the calling thread, answering with the same script.

Two figures per round, as ratios side / library (1.0 = no overhead):

* ``step_ratio``: median latency of one model turn (library: from answering a call to the next
  call arriving, i.e. the harness running the tool and posting again; gym: one ``env.step``),
  reported as library / gym so that 1.0 means no overhead and smaller is slower;
* ``episode_ratio``: steps per second over whole episodes (resets included: each starts the
  harness program, ~1-2 s, which dwarfs everything else).

Sides alternate in rounds (the machine is shared and noisy); the figures are medians of rounds.

    python benchmarks/verifiers_v1_bench.py [--reps 3] [--episodes 4] [--steps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

from openenv_gym import runtime
from openenv_gym.adapters.verifiers import v1 as v1
from openenv_gym.adapters.verifiers.v1_calls import completion
from openenv_gym.adapters.verifiers.v1_servers import injected_interception_class
from openenv_gym.env import AgentEnv

SOURCE = Path(__file__).resolve().parent.parent / "tests" / "envs" / "verifiers_v1" / "vf1_calc"
ENV_ARGS = {"task": {"shared_tools": True}}


def script(messages: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """``steps - 1`` multiplications, then the product as the answer (a won episode)."""
    tools = [m for m in messages if m["role"] == "tool"]
    if len(tools) < steps - 1:
        a, b = re.findall(r"\d+", next(m["content"] for m in messages if m["role"] == "user"))[:2]
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{len(tools)}", "type": "function",
            "function": {"name": "calc_multiply", "arguments": json.dumps({"a": int(a), "b": int(b)})}}]}
    return {"role": "assistant", "content": str(tools[0]["content"])}


def _library_agent(adapter: v1.VerifiersV1Adapter, steps: int, gaps: list[float]) -> tuple[Any, Any]:
    """An Agent like the adapter's, whose model is the script itself (answers at once)."""
    import verifiers.v1 as vf
    from verifiers.v1.clients import Client

    class Scripted(Client):
        def __init__(self) -> None:
            self.answered: dict[str | None, float] = {}

        def _answer(self, body: dict, session_id: str | None) -> dict:
            now = time.perf_counter()
            if session_id in self.answered:
                gaps.append(now - self.answered[session_id])
            raw = completion(None, [], body.get("model"))
            raw["choices"][0]["message"] = message = script(body["messages"], steps)
            raw["choices"][0]["finish_reason"] = "tool_calls" if message.get("tool_calls") else "stop"
            self.answered[session_id] = time.perf_counter()
            return raw

        async def get_response(self, dialect, body, sampling, session_id=None, turn=None, headers=None):
            raw = self._answer(body, session_id)
            response = dialect.parse_response(dialect.validate_response(raw))
            response.raw = raw
            return response

        async def relay(self, dialect, body, session_id=None, headers=None):
            from verifiers.v1.clients.client import RelayReply

            events = dialect.stream_events(self._answer(body, session_id))

            async def chunks():
                for event in events:
                    yield event

            async def close():
                return None

            return RelayReply("text/event-stream", chunks(), close)

    server = injected_interception_class()(Scripted())
    config = adapter._agent_configs["agent"].model_copy(update={
        "client": vf.EvalClientConfig(base_url="http://127.0.0.1:9/v1", api_key_var="NO_SUCH_KEY")})
    return vf.Agent(config, interception=server), server


async def _library(adapter: v1.VerifiersV1Adapter, episodes: int, steps: int) -> tuple[int, float, float, list[float]]:
    gaps: list[float] = []
    agent, server = _library_agent(adapter, steps, gaps)
    tasks = await adapter._tasks("train")
    total, count = 0.0, 0
    async with server:
        start = time.perf_counter()
        for n in range(episodes):
            trace = await agent.run(tasks[n % len(tasks)], tools=adapter.shared_tools or None)
            assert trace.ok and trace.num_turns == steps, (trace.errors, trace.num_turns)
            total, count = total + float(trace.reward), count + steps
        elapsed = time.perf_counter() - start
    return count, elapsed, total, gaps


def _gym(env: AgentEnv, episodes: int, steps: int) -> tuple[int, float, float, list[float]]:
    lat: list[float] = []
    total, count = 0.0, 0
    n_tasks = env.num_tasks("train")
    start = time.perf_counter()
    for n in range(episodes):
        obs, _ = env.reset(options={"index": n % n_tasks})
        history = list(obs)
        for k in range(steps):
            action = script(history, steps)
            t0 = time.perf_counter()
            obs, reward, terminated, truncated, _ = env.step(action)
            if k < steps - 1:  # the last step also runs scoring and teardown: not a model turn
                lat.append(time.perf_counter() - t0)
            history += [action, *obs]
        assert terminated and not truncated
        total, count = total + float(reward), count + steps
    return count, time.perf_counter() - start, total, lat


def bench_v1(reps: int = 3, episodes: int = 4, steps: int = 5, source: str | Path = SOURCE) -> dict[str, Any]:
    """Run ``reps`` alternating rounds of ``episodes`` episodes of ``steps`` steps per side; print and return."""
    env = AgentEnv(v1.VerifiersV1Adapter(source=str(source), env_args=ENV_ARGS))
    adapter = env.adapter
    assert isinstance(adapter, v1.VerifiersV1Adapter)
    rounds: list[dict[str, Any]] = []
    try:
        t0 = time.perf_counter()
        env.reset(options={"index": 0})
        first_reset = time.perf_counter() - t0
        runtime.run_sync(_library(adapter, 1, steps))  # warm-up
        _gym(env, 1, steps)
        for _ in range(reps):
            lib = runtime.run_sync(_library(adapter, episodes, steps))
            gym_ = _gym(env, episodes, steps)
            assert lib[2] == gym_[2] == episodes, (lib[2], gym_[2])  # every episode won, both sides
            lib_step, gym_step = statistics.median(lib[3]), statistics.median(gym_[3])
            rounds.append({
                "library_step_ms": lib_step * 1e3, "gym_step_ms": gym_step * 1e3,
                "step_ratio": lib_step / gym_step,
                "library_steps_per_s": lib[0] / lib[1], "gym_steps_per_s": gym_[0] / gym_[1],
                "episode_ratio": (gym_[0] / gym_[1]) / (lib[0] / lib[1]),
            })
    finally:
        env.close()
    result: dict[str, Any] = {
        "episodes_per_round": episodes, "steps_per_episode": steps, "rounds": rounds,
        "first_reset_s": first_reset,
        **{key: statistics.median(r[key] for r in rounds)
           for key in ("library_step_ms", "gym_step_ms", "step_ratio", "library_steps_per_s",
                       "gym_steps_per_s", "episode_ratio")},
    }
    print(f"verifiers v1, {episodes} episodes x {steps} steps x {reps} rounds (vf1_calc, shared tool server, null harness)")
    print(f"  first reset (this env)   : {first_reset:.2f} s")
    print(f"  model turn, library      : {result['library_step_ms']:.1f} ms")
    print(f"  model turn, AgentEnv.step: {result['gym_step_ms']:.1f} ms  -> step_ratio {result['step_ratio']:.2f} "
          f"(+{result['gym_step_ms'] - result['library_step_ms']:.1f} ms/step)")
    print(f"  whole episodes           : library {result['library_steps_per_s']:.2f} steps/s, gym "
          f"{result['gym_steps_per_s']:.2f} steps/s -> episode_ratio {result['episode_ratio']:.2f}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from figures import figure, write

    result = bench_v1(args.reps, args.episodes, args.steps)
    rounds = result["rounds"]
    write(args.json, [
        figure("Verifiers v1: AgentEnv.step model turn vs the library's", [r["step_ratio"] for r in rounds]),
        figure("Verifiers v1: whole episodes vs the library's", [r["episode_ratio"] for r in rounds]),
    ], result)


if __name__ == "__main__":
    main()
