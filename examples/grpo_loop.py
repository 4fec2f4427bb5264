"""A plain GRPO data loop: grouped episodes in, token-level training samples with advantages out.

This is the part of a GRPO/RLOO trainer that talks to environments, with no trainer attached:
each iteration plays ``--groups`` groups of ``--group-size`` episodes over
``gym.make_vec("openenv/Arithmetic-v0", num_envs=N, group_size=k)`` (the ``k`` members of a group
play the same task), asks an OpenAI-compatible server for every assistant turn together with its
token ids and logprobs, and turns each finished group into training samples: one per assistant
turn, ``(prompt_ids, completion_ids, logprobs, advantage)``, where the advantage is the episode's
group-normalised return ``(r - mean) / (std + eps)``. Those samples are exactly what a policy-
gradient step consumes; here they are counted (and written with ``--out``) instead.

Why the pieces are what they are:

* ``rollout.run`` drives the vector env first-ready (a slow episode never holds up the others) and
  hands over a group's records only once all ``k`` are done, each with its ``advantage``.
* ``OpenAIPolicy(token_ids=True)`` asks for ``logprobs`` and vLLM's ``return_token_ids``, so the
  samples hold the ids the model actually saw and produced: nothing is re-tokenised. The loop
  also checks that each turn's prompt extends the previous turn's prompt and completion (what a
  trainer relies on when it packs a whole episode into one sequence) and prints any break.
* Each iteration resets with a new seed, so every iteration draws new tasks, reproducibly.

Offline (default), a bundled OpenAI-compatible stub plays the model: it solves Arithmetic with the
calculator but submits a wrong answer with probability ``--miss``, so groups get mixed rewards and
non-zero advantages, as a sampling model's would. In real use, point it at vLLM (0.10.2+, with a
tool parser so tool calls come back as ``tool_calls``)::

    vllm serve Qwen/Qwen2.5-1.5B-Instruct --enable-auto-tool-choice --tool-call-parser hermes
    python examples/grpo_loop.py --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-1.5B-Instruct

    python examples/grpo_loop.py --iterations 3 --groups 4 --group-size 4     # offline, seconds
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import gymnasium as gym
import numpy as np

import openenv_gym  # noqa: F401  (registers openenv/Arithmetic-v0)
from openenv_gym import rollout
from openenv_gym.policies import OpenAIPolicy
from openenv_gym.testing.openai_stub import OpenAIStub, sometimes_wrong

ENV_ID = "openenv/Arithmetic-v0"


def group_key(iteration: int, record: dict[str, Any]) -> str:
    """A group's name: the iteration, the sub-env group and which of that group's episodes it was."""
    return f"{iteration}:{record['group']}:{record['group_episode']}"


def training_samples(record: dict[str, Any], group: str, episode: str) -> tuple[list[dict[str, Any]], int]:
    """One sample per assistant turn of a finished episode, and how many turns broke the prefix.

    A turn's prompt should start with the previous turn's prompt and completion; when it does not
    (a chat template that rewrites history), per-turn samples are still right, but packing the
    episode into one sequence would not be.
    """
    prompts, completions = record.get("prompt_token_ids"), record.get("completion_token_ids")
    turns = sum(m.get("role") == "assistant" for m in record["messages"])
    if not prompts or not completions or None in prompts or None in completions or len(prompts) != turns:
        raise SystemExit("the server returned no token ids: serve the model with vLLM 0.10.2+ "
                         "(it returns them when asked with return_token_ids) or use the bundled stub")
    logprobs = record.get("logprobs") or [None] * turns
    samples, breaks, seen = [], 0, None
    for prompt, completion, logp in zip(prompts, completions, logprobs):
        if seen is not None and prompt[:len(seen)] != seen:
            breaks += 1
        seen = prompt + completion
        samples.append({"group": group, "episode": episode, "task_id": record["task_id"],
                        "reward": record["total_reward"], "advantage": record["advantage"],
                        "prompt_ids": prompt, "completion_ids": completion, "logprobs": logp})
    return samples, breaks


def iterate(envs: Any, policy: OpenAIPolicy, iteration: int,
            args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Play one iteration's groups; return its figures and its training samples."""
    start = time.perf_counter()
    records: list[dict[str, Any]] = []
    stats = rollout.run(envs, policy, args.groups * args.group_size, seed=args.seed + iteration,
                        on_episode=records.append, drop_equal=args.drop_equal)
    samples, breaks = [], 0
    for n, record in enumerate(records):
        got, broke = training_samples(record, group_key(iteration, record), f"{iteration}:{n}")
        samples += got
        breaks += broke
    figures = {
        "iteration": iteration, "episodes": len(stats.returns), "groups": stats.groups,
        "dropped_groups": stats.dropped_groups, "mean_reward": float(np.mean(stats.returns)),
        f"pass@{args.group_size}": stats.pass_at_k, "assistant_turns": sum(
            sum(m.get("role") == "assistant" for m in r["messages"]) for r in records),
        "samples": len(samples), "tokens": sum(len(s["prompt_ids"]) + len(s["completion_ids"]) for s in samples),
        "prefix_breaks": breaks, "errors": stats.errors, "seconds": time.perf_counter() - start,
    }
    return figures, samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible server (default: start the bundled stub)")
    parser.add_argument("--model", default="stub", help="the model name to request")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4, help="groups per iteration")
    parser.add_argument("--group-size", type=int, default=4, help="episodes per group (k)")
    parser.add_argument("--num-envs", type=int, help="sub-envs (a multiple of --group-size; default: groups x k)")
    parser.add_argument("--drop-equal", action="store_true", help="leave out groups whose rewards are all equal")
    parser.add_argument("--miss", type=float, default=0.5, help="stub only: chance of a wrong submission")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write every training sample as a JSON line here")
    parser.add_argument("--json", help="write the per-iteration figures here")
    args = parser.parse_args(argv)
    num_envs = args.num_envs or args.groups * args.group_size

    stub = None
    if args.base_url is None:
        stub = OpenAIStub(sometimes_wrong(args.miss, args.seed)).start()
    policy = OpenAIPolicy(args.base_url or stub.url, args.model, token_ids=True, temperature=args.temperature)
    envs = gym.make_vec(ENV_ID, num_envs=num_envs, group_size=args.group_size, autoreset_mode="SameStep")
    out = open(args.out, "w") if args.out else None
    history = []
    try:
        print(f"{ENV_ID}: {num_envs} sub-envs in groups of {args.group_size}, model {args.model!r} "
              f"at {'the bundled stub' if stub else args.base_url}")
        for iteration in range(args.iterations):
            figures, samples = iterate(envs, policy, iteration, args)
            history.append(figures)
            if out is not None:
                out.writelines(json.dumps(s) + "\n" for s in samples)
            # A trainer would take its policy-gradient step on `samples` here.
            print(f"iter {iteration}: {figures['episodes']} episodes, {figures['groups']} groups "
                  f"({figures['dropped_groups']} dropped), mean reward {figures['mean_reward']:.3f}, "
                  f"pass@{args.group_size} {figures[f'pass@{args.group_size}']:.3f}, "
                  f"{figures['samples']} samples ({figures['tokens']} tokens), "
                  f"prefix breaks {figures['prefix_breaks']}, {figures['seconds']:.2f} s", flush=True)
    finally:
        envs.close()
        policy.close()
        if stub is not None:
            stub.stop()
        if out is not None:
            out.close()
    total = sum(f["samples"] for f in history)
    print(f"done: {len(history)} iterations, {total} training samples")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"group_size": args.group_size, "iterations": history}, f, indent=1)


if __name__ == "__main__":
    main()
