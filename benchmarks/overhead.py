"""Overhead of ``gym.make("openenv/Arithmetic-v0")`` against raw HTTP loops on the same server.

Both sides play the same scripted episodes against the same ORS server process (the bundled
Arithmetic example, launched once): create a session, read the prompt and the task's tools, call
``calculator`` with the question, ``submit`` the result, delete the session. The raw side is a
plain ``httpx.Client`` loop making exactly those HTTP calls with a minimal SSE read; the gym side
goes through AgentEnv, the runtime loop, action parsing and the SSE decoder.

The machine is shared and noisy, so the sides alternate in rounds and each figure is the median
of the per-round ratios (env-steps/sec gym / raw) with its min-max. Three raw baselines: an
``aiohttp`` loop (the client stack under the adapter, so the ratio is the cost of the Gymnasium
layer), an ``httpx.AsyncClient`` loop (target >= 0.90) and an ``httpx.Client`` loop (sync httpx
has the cheapest per-request path; for information).

    python benchmarks/overhead.py [--episodes 200] [--reps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


async def _run_aiohttp(url: str, env_name: str, episodes: int, offset: int) -> tuple[int, float, float]:
    import aiohttp

    connector: aiohttp.BaseConnector = aiohttp.TCPConnector()
    if url.startswith("unix:"):
        connector, url = aiohttp.UnixConnector(path=url[len("unix:"):]), "http://ors"
    steps, total = 0, 0.0
    async with aiohttp.ClientSession(connector=connector) as client:
        start = time.perf_counter()
        for n in range(episodes):
            h = {"X-Session-ID": uuid.uuid4().hex}
            async with client.post(f"{url}/create", json={"env_name": env_name, "split": "train",
                                                          "index": (offset + n) % 2000}, headers=h) as r:
                r.raise_for_status()
            async with client.get(f"{url}/{env_name}/prompt", headers=h) as r:
                prompt = (await r.json())[0]["text"]
            async with client.get(f"{url}/{env_name}/task_tools", headers=h) as r:
                await r.read()
            async with client.post(f"{url}/{env_name}/call", headers=h, json={
                    "name": "calculator", "input": {"expression": _question(prompt)}}) as r:
                value = _sse_end(await r.text())["output"]["blocks"][0]["text"]
            async with client.post(f"{url}/{env_name}/call", headers=h, json={
                    "name": "submit", "input": {"answer": value}}) as r:
                result = _sse_end(await r.text())
            async with client.post(f"{url}/delete", headers=h) as r:
                await r.read()
            steps, total = steps + 2, total + (result["output"]["reward"] or 0.0)
        return steps, time.perf_counter() - start, total


def run_aiohttp(url: str, env_name: str, episodes: int, offset: int) -> tuple[int, float, float]:
    return asyncio.run(_run_aiohttp(url, env_name, episodes, offset))


def main() -> None:
    from figures import figure, write

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200, help="episodes per side per round")
    parser.add_argument("--reps", "--rounds", dest="reps", type=int, default=5, help="rounds")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    env = gym.make("openenv/Arithmetic-v0")
    adapter = env.unwrapped.adapter
    url = adapter.connection()["url"]
    client = httpx.Client(timeout=60.0, **_raw_client_args(url, httpx.HTTPTransport))
    try:
        run_gym(env, 20, 0), run_raw(client, adapter.env_name, 20, 0)  # warm every path up
        run_raw_async(url, adapter.env_name, 20, 0), run_aiohttp(url, adapter.env_name, 20, 0)
        rows = []
        for r in range(args.reps):
            offset = 100 + r * args.episodes
            g_steps, g_sec, g_rew = run_gym(env, args.episodes, offset)
            h_steps, h_sec, h_rew = run_aiohttp(url, adapter.env_name, args.episodes, offset)
            a_steps, a_sec, a_rew = run_raw_async(url, adapter.env_name, args.episodes, offset)
            s_steps, s_sec, s_rew = run_raw(client, adapter.env_name, args.episodes, offset)
            assert g_rew == h_rew == a_rew == s_rew == args.episodes, "every side must solve every task"
            row = {"gym": g_steps / g_sec, "raw_aiohttp": h_steps / h_sec, "raw_async": a_steps / a_sec,
                   "raw_sync": s_steps / s_sec}
            for k in ("raw_aiohttp", "raw_async", "raw_sync"):
                row[f"ratio_{k[4:]}"] = row["gym"] / row[k]
            rows.append(row)
            print(f"round {r}: gym {row['gym']:7.1f}  raw aiohttp {row['raw_aiohttp']:7.1f}  raw httpx async "
                  f"{row['raw_async']:7.1f}  raw httpx sync {row['raw_sync']:7.1f} env-steps/s")
    finally:
        client.close()
        env.close()
    figures = [
        figure("single env vs raw httpx async loop", [r["ratio_async"] for r in rows], target=0.90),
        figure("single env vs raw aiohttp loop", [r["ratio_aiohttp"] for r in rows]),
        figure("single env vs raw httpx sync loop", [r["ratio_sync"] for r in rows]),
    ]
    for f in figures:
        print(f"{f['name']}: {f['median']:.3f} ({f['min']:.3f}-{f['max']:.3f})"
              + (f"  (target >= {f['target']})" if f["target"] else ""))
    write(args.json, figures, {"rounds": rows, "episodes": args.episodes})


if __name__ == "__main__":
    main()
