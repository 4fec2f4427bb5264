"""Overhead of ``gym.make("openenv/Arithmetic-v0")`` against a raw httpx loop on the same server.

Both sides play the same scripted episodes against the same ORS server process (the bundled
Arithmetic example, launched once): create a session, read the prompt and the task's tools, call
``calculator`` with the question, ``submit`` the result, delete the session. The raw side is a
plain ``httpx.Client`` loop making exactly those HTTP calls with a minimal SSE read; the gym side
goes through AgentEnv, the runtime loop, action parsing and the SSE decoder.

The machine is shared and noisy, so the two sides alternate in rounds and the figure reported is
the median of the per-round ratios (env-steps/sec gym / raw). Two raw baselines: an
``httpx.AsyncClient`` loop (the same client stack the adapter uses, so the ratio is the cost of
the Gymnasium layer; target >= 0.90) and an ``httpx.Client`` loop (sync httpx has a cheaper
per-request path; reported for information).

    python benchmarks/overhead.py [--episodes 200] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

import gymnasium as gym
import httpx

import openenv_gym  # noqa: F401


def _call(name: str, args: dict) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _question(prompt: str) -> str:
    return prompt.split("Compute ", 1)[1].split(". ", 1)[0]


def run_gym(env: gym.Env, episodes: int, offset: int) -> tuple[int, float, float]:
    steps, total = 0, 0.0
    start = time.perf_counter()
    for n in range(episodes):
        obs, _ = env.reset(options={"index": (offset + n) % 2000})
        obs, *_ = env.step(_call("calculator", {"expression": _question(obs[0]["content"])}))
        _, reward, terminated, _, _ = env.step(_call("submit", {"answer": obs[0]["content"]}))
        assert terminated
        steps, total = steps + 2, total + reward
    return steps, time.perf_counter() - start, total


def _sse_end(text: str) -> dict:
    parts, event = [], None
    for line in text.splitlines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:") and event in ("chunk", "end"):
            parts.append(line[6:] if line[5:6] == " " else line[5:])
    return json.loads("".join(parts))


def run_raw(client: httpx.Client, env_name: str, episodes: int, offset: int) -> tuple[int, float, float]:
    steps, total = 0, 0.0
    start = time.perf_counter()
    for n in range(episodes):
        headers = {"X-Session-ID": uuid.uuid4().hex}
        client.post("/create", json={"env_name": env_name, "split": "train", "index": (offset + n) % 2000},
                    headers=headers).raise_for_status()
        prompt = client.get(f"/{env_name}/prompt", headers=headers).json()[0]["text"]
        client.get(f"/{env_name}/task_tools", headers=headers).raise_for_status()
        calc = _sse_end(client.post(f"/{env_name}/call", headers=headers, json={
            "name": "calculator", "input": {"expression": _question(prompt)}}).text)
        value = calc["output"]["blocks"][0]["text"]
        result = _sse_end(client.post(f"/{env_name}/call", headers=headers, json={
            "name": "submit", "input": {"answer": value}}).text)
        client.post("/delete", headers=headers).raise_for_status()
        steps, total = steps + 2, total + (result["output"]["reward"] or 0.0)
    return steps, time.perf_counter() - start, total


def _raw_client_args(url: str, transport: type) -> dict:
    """The bundled server listens on a private Unix socket (``unix:<path>``): raw clients use it too."""
    if url.startswith("unix:"):
        return {"base_url": "http://ors", "transport": transport(uds=url[len("unix:"):])}
    return {"base_url": url}


async def _run_raw_async(url: str, env_name: str, episodes: int, offset: int) -> tuple[int, float, float]:
    steps, total = 0, 0.0
    async with httpx.AsyncClient(timeout=60.0, **_raw_client_args(url, httpx.AsyncHTTPTransport)) as client:
        start = time.perf_counter()
        for n in range(episodes):
            headers = {"X-Session-ID": uuid.uuid4().hex}
            (await client.post("/create", json={"env_name": env_name, "split": "train", "index": (offset + n) % 2000},
                               headers=headers)).raise_for_status()
            prompt = (await client.get(f"/{env_name}/prompt", headers=headers)).json()[0]["text"]
            (await client.get(f"/{env_name}/task_tools", headers=headers)).raise_for_status()
            calc = _sse_end((await client.post(f"/{env_name}/call", headers=headers, json={
                "name": "calculator", "input": {"expression": _question(prompt)}})).text)
            value = calc["output"]["blocks"][0]["text"]
            result = _sse_end((await client.post(f"/{env_name}/call", headers=headers, json={
                "name": "submit", "input": {"answer": value}})).text)
            (await client.post("/delete", headers=headers)).raise_for_status()
            steps, total = steps + 2, total + (result["output"]["reward"] or 0.0)
        return steps, time.perf_counter() - start, total


def run_raw_async(url: str, env_name: str, episodes: int, offset: int) -> tuple[int, float, float]:
    return asyncio.run(_run_raw_async(url, env_name, episodes, offset))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200, help="episodes per side per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    env = gym.make("openenv/Arithmetic-v0")
    adapter = env.unwrapped.adapter
    url = adapter._server.url
    client = httpx.Client(timeout=60.0, **_raw_client_args(url, httpx.HTTPTransport))
    try:
        run_gym(env, 20, 0), run_raw(client, adapter.env_name, 20, 0)  # warm both paths up
        run_raw_async(url, adapter.env_name, 20, 0)
        rows = []
        for r in range(args.rounds):
            offset = 100 + r * args.episodes
            g_steps, g_sec, g_rew = run_gym(env, args.episodes, offset)
            a_steps, a_sec, a_rew = run_raw_async(url, adapter.env_name, args.episodes, offset)
            s_steps, s_sec, s_rew = run_raw(client, adapter.env_name, args.episodes, offset)
            assert g_rew == a_rew == s_rew == args.episodes, "every side must solve every task"
            row = {"gym": g_steps / g_sec, "raw_async": a_steps / a_sec, "raw_sync": s_steps / s_sec}
            row["ratio_async"] = row["gym"] / row["raw_async"]
            row["ratio_sync"] = row["gym"] / row["raw_sync"]
            rows.append(row)
            print(f"round {r}: gym {row['gym']:7.1f}  raw httpx async {row['raw_async']:7.1f}  "
                  f"raw httpx sync {row['raw_sync']:7.1f} env-steps/s   ratios {row['ratio_async']:.3f} / "
                  f"{row['ratio_sync']:.3f}")
    finally:
        client.close()
        env.close()
    ratio_async = statistics.median(r["ratio_async"] for r in rows)
    ratio_sync = statistics.median(r["ratio_sync"] for r in rows)
    print(f"median ratio gym / raw httpx.AsyncClient loop = {ratio_async:.3f}  (target >= 0.90)")
    print(f"median ratio gym / raw httpx.Client loop      = {ratio_sync:.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rounds": rows, "median_ratio_async": ratio_async, "median_ratio_sync": ratio_sync,
                       "episodes": args.episodes}, fh, indent=2)

if __name__ == "__main__":
    main()
