"""A Verifiers environment served over OpenEnv's protocol, played by OpenEnv's own client inside a
TRL-style ``rollout_func``: what a trainer that speaks OpenEnv (TRL's OpenEnv integration) needs to
train on any environment openenv_gym can run.

The pieces:

* **The server**: ``openenv-gym serve openenv/Verifiers-v0 source=examples/vf_sums_retry.py --protocol
  openenv`` (started here in-process with ``openenv_gym.served`` unless ``--env-url`` names a
  running one). The Verifiers env answers in text, so it is served with one tool, ``respond``,
  whose ``content`` is the assistant's message.
* **The client**: OpenEnv's ``MCPToolClient``, one per episode, all at once: ``reset(split=...,
  index=...)`` picks the task (the opening messages are in ``metadata["prompt"]``), each assistant
  turn is ``step(CallToolAction("respond", {"content": text}))``, and ``reward``/``done`` come back
  with the environment's reply.
* **The rollout function**: ``rollout_func(prompts, trainer) -> dict``, TRL's hook (1.16): one
  sample per prompt, ``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask`` (0 on the
  tokens the environment wrote between turns) and ``env_reward``, which TRL forwards to the reward
  function :func:`reward_from_env`. Here a dataset row's prompt names its task, ``"train/INDEX"``.
* **The model**: any OpenAI-compatible server returning token ids and logprobs (vLLM 0.10.2+:
  ``return_token_ids``, ``logprobs``). Offline (the default) the bundled stub
  (``openenv_gym/testing/openai_stub.py``) plays it: it adds the two numbers, but answers one too
  many with probability ``--miss``, so some episodes take several turns and some fail. No GPU, no
  network.

    python examples/serve_openenv_rollout.py --prompts 8            # offline: stub model, served env in-process
    openenv-gym serve openenv/Verifiers-v0 source=examples/vf_sums_retry.py --protocol openenv --port 8001 &
    python examples/serve_openenv_rollout.py --env-url http://127.0.0.1:8001 --base-url http://127.0.0.1:8000/v1 --model M
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import httpx

import openenv_gym
from openenv_gym.testing.openai_stub import OpenAIStub

SOURCE = Path(__file__).resolve().parent / "vf_sums_retry.py"
ENV_ID = "openenv/Verifiers-v0"
MAX_TURNS = 3


def sum_solver(miss: float, seed: int) -> Any:
    """A stub script: the sum of the last question, one too many with probability ``miss``."""
    rng, lock = random.Random(seed), threading.Lock()

    def script(request: dict[str, Any]) -> dict[str, Any]:
        question = next(m["content"] for m in reversed(request["messages"]) if "What is" in (m.get("content") or ""))
        a, b = map(int, re.findall(r"\d+", question)[:2])
        with lock:
            wrong = rng.random() < miss
        return {"role": "assistant", "content": str(a + b + (1 if wrong else 0))}

    return script


async def generate(http: httpx.AsyncClient, base_url: str, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One assistant turn, with the token ids of its prompt and completion and their logprobs."""
    reply = await http.post(f"{base_url}/chat/completions", json={
        "model": model, "messages": messages, "return_token_ids": True, "logprobs": True})
    reply.raise_for_status()
    body = reply.json()
    choice = body["choices"][0]
    return {"text": choice["message"]["content"] or "", "prompt_ids": body["prompt_token_ids"],
            "completion_ids": choice["token_ids"], "logprobs": [t["logprob"] for t in choice["logprobs"]["content"]]}


async def play(env_url: str, headers: dict[str, str], task: str, http: httpx.AsyncClient, base_url: str,
               model: str) -> dict[str, Any]:
    """One episode through OpenEnv's client: a TRL sample (the first turn's prompt, every turn's
    completion with the environment's replies between them masked out) and its reward."""
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.mcp_client import MCPToolClient

    split, index = task.split("/")
    async with MCPToolClient(base_url=env_url, headers=headers) as env:
        opening = await env.reset(split=split, index=int(index))
        messages = list(opening.observation.metadata["prompt"])
        prompt_ids: list[int] | None = None
        completion_ids: list[int] = []
        logprobs: list[float] = []
        env_mask: list[int] = []
        reward, turns = 0.0, 0
        for _ in range(MAX_TURNS):
            turns += 1
            out = await generate(http, base_url, model, messages)
            if prompt_ids is None:
                prompt_ids = out["prompt_ids"]
            else:  # the environment's reply: what this turn's prompt adds after everything before it
                seen = len(prompt_ids) + len(completion_ids)
                assert out["prompt_ids"][:seen] == prompt_ids + completion_ids, "the prompt must extend the last turn"
                between = out["prompt_ids"][seen:]
                completion_ids += between
                logprobs += [0.0] * len(between)
                env_mask += [0] * len(between)
            completion_ids += out["completion_ids"]
            logprobs += out["logprobs"]
            env_mask += [1] * len(out["completion_ids"])
            messages.append({"role": "assistant", "content": out["text"]})
            result = await env.step(CallToolAction(tool_name="respond", arguments={"content": out["text"]}))
            reward += result.reward or 0.0
            if result.done:
                break
            messages.append({"role": "user", "content": result.observation.result["data"]})
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs, "env_mask": env_mask,
            "env_reward": reward, "turns": turns}


def make_rollout_func(env_url: str, headers: dict[str, str], base_url: str, model: str) -> Any:
    """TRL's hook: ``rollout_func(prompts, trainer) -> dict`` of lists, one entry per prompt."""

    def rollout_func(prompts: list[str], trainer: Any = None) -> dict[str, list[Any]]:
        async def run() -> list[dict[str, Any]]:
            async with httpx.AsyncClient(timeout=120) as http:
                return await asyncio.gather(*(play(env_url, headers, p, http, base_url, model) for p in prompts))

        samples = asyncio.run(run())
        return {key: [s[key] for s in samples] for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                            "env_reward", "turns")}

    return rollout_func


def reward_from_env(completions: list[Any], env_reward: list[float], **kwargs: Any) -> list[float]:
    """The reward function TRL calls: the environment's reward, forwarded by ``rollout_func``."""
    return [float(r) for r in env_reward]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="prompts in the batch (tasks train/0, train/1, ...)")
    parser.add_argument("--env-url", default=None, help="a running served env (default: serve one in-process)")
    parser.add_argument("--base-url", default=None, help="an OpenAI-compatible server (default: the offline stub)")
    parser.add_argument("--model", default="stub", help="the model name for --base-url")
    parser.add_argument("--miss", type=float, default=0.5, help="offline: how often the stub answers wrong")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    stub = OpenAIStub(sum_solver(args.miss, args.seed)) if args.base_url is None else nullcontext()
    served = (openenv_gym.served(ENV_ID, protocol="openenv", source=str(SOURCE), max_sessions=max(8, args.prompts))
              if args.env_url is None else nullcontext(args.env_url))
    with stub as running_stub, served as env_url:
        base_url = args.base_url or running_stub.url
        token = getattr(env_url, "token", None) or os.environ.get("OPENENV_GYM_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        rollout_func = make_rollout_func(env_url, headers, base_url, args.model)
        prompts = [f"train/{i}" for i in range(args.prompts)]
        batch = rollout_func(prompts)
        rewards = reward_from_env([None] * len(prompts), batch["env_reward"])
    for i, prompt in enumerate(prompts):
        assert len(batch["completion_ids"][i]) == len(batch["logprobs"][i]) == len(batch["env_mask"][i])
        print(f"{prompt}: reward {rewards[i]:.1f} in {batch['turns'][i]} turn(s), {len(batch['prompt_ids'][i])} prompt "
              f"tokens, {len(batch['completion_ids'][i])} completion tokens ({sum(batch['env_mask'][i])} the model's)")
    print(f"batch: {len(prompts)} samples, mean reward {statistics.mean(rewards):.3f}, "
          f"{sum(batch['turns'])} turns")


if __name__ == "__main__":
    main()
