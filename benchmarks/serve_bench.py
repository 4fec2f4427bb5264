"""Serving: an env served by ``openenv-gym serve`` against the same env played directly, and against
the native server of its ecosystem, over both protocols, in env-steps/s.

* **ORS**: the bundled Arithmetic env. *Served*: ``openenv-gym serve openenv/Arithmetic-v0
  in_process=true --protocol ors``: the env class runs in the gateway's process, as ors-sdk's own
  ``Server`` runs it. *Served over its server*: the same without ``in_process``: the gateway's ORS
  adapter over the env's own local server, a second HTTP hop per request (shown for scale).
  *Native*: ors-sdk's own ``Server`` serving the same class (``python
  openenv_gym/examples/arithmetic.py PORT``). All driven by one raw ORS client on aiohttp (the same
  requests: ``/create``, ``/prompt``, two ``/call`` streams, ``/delete`` per episode), so the
  figure is the servers'. *Direct*: ``gym.make("openenv/Arithmetic-v0", in_process=True)`` (and
  ``gym.make_vec`` of 64, first-ready batches of 16) in this process.
* **OpenEnv**: the MCP echo env of ``tests/envs/openenv_echo_env``. *Served*: ``openenv-gym serve
  openenv/OpenEnv-v0 source=... in_process=true --protocol openenv``: the class its app gives
  ``create_app`` runs in the gateway's process, as OpenEnv's own server runs it. *Served over its
  server*: the same without ``in_process`` (the OpenEnv adapter over the env's own local server, a
  second WebSocket hop per message; shown for scale). *Native*: OpenEnv's ``create_app`` server of
  it under uvicorn. All driven by one raw WebSocket client (``reset``, then ``call_tool`` echo and
  guess per episode). *Direct*: ``gym.make("openenv/OpenEnv-v0", source=..., in_process=True)``.

An episode is a reset and two steps (the last one ends it with reward 1.0, checked); a figure counts
the steps, resets included in the time. Each case runs *single* (one client, episodes in turn) and
with *64 concurrent sessions* (64 coroutines on one event loop; the direct side a vector env of 64).
The sides alternate in rounds (the machine is shared and noisy), served and native next to each
other in every round and each of them first in every other; reported: the median of the
per-round ratios (served / native, served / direct) with their min and max.

    python benchmarks/serve_bench.py [--seconds 4] [--rounds 5] [--sessions 64] [--only ors,openenv] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import gymnasium as gym

import openenv_gym  # noqa: F401
from openenv_gym.vector.base import info_at

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ARITHMETIC = ROOT / "openenv_gym" / "examples" / "arithmetic.py"
ECHO = ROOT / "tests" / "envs" / "openenv_echo_env"
TOKEN = secrets.token_urlsafe(32)
HEADERS = {"Authorization": f"Bearer {TOKEN}"}

sys.path.insert(0, str(HERE))
from servers import free_port, wait_healthy  # noqa: E402


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _expression(prompt: str) -> str:
    return prompt.split("Compute ", 1)[1].split(". ", 1)[0]


# -- servers ---------------------------------------------------------------------------------------------
def start_served(env_id: str, protocol: str, sessions: int, *kwargs: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "openenv_gym.cli", "serve", env_id, *kwargs, "--protocol", protocol, "--port", str(port),
         "--max-sessions", str(sessions + 8)],
        env=dict(os.environ, OPENENV_GYM_TOKEN=TOKEN), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"openenv-gym serve exited with {proc.returncode}")
        try:
            import httpx

            if httpx.get(f"{url}/health", headers=HEADERS, timeout=1.0).status_code == 200:
                return proc, url
        except Exception:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("openenv-gym serve did not start")


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu() -> float:
    """CPU seconds of this process and every live process under it (servers, their workers)."""
    from openenv_gym.testing import procs

    total = time.process_time()
    for pid in procs.descendants():
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, IndexError, ValueError):
            pass
    return total


def measured(fn: Callable[[], tuple[float, int]]) -> tuple[float, float]:
    """``fn()``'s env-steps/s, and the CPU microseconds per env-step of every process involved."""
    cpu = tree_cpu()
    rate, steps = fn()
    return rate, (tree_cpu() - cpu) / max(1, steps) * 1e6


def start_native_ors() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ARITHMETIC), str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return wait_healthy(proc, f"http://127.0.0.1:{port}", "ors-sdk")


def start_native_openenv(sessions: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, MAX_CONCURRENT_ENVS=str(sessions + 8), ENABLE_WEB_INTERFACE="false")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "openenv_echo_env.server.app:app", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"], cwd=str(ECHO.parent), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return wait_healthy(proc, f"http://127.0.0.1:{port}", "OpenEnv")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- clients of the servers (one code for served and native) --------------------------------------------------
class ORSClient:
    """The ORS requests of an Arithmetic episode, on one aiohttp session."""

    def __init__(self, http: aiohttp.ClientSession, url: str, headers: dict[str, str]):
        self.http, self.url, self.headers, self.name = http, url, headers, "arithmetic"

    async def _call(self, sid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        data = []
        async with self.http.post(f"{self.url}/{self.name}/call", json={"name": name, "input": args},
                                  headers={**self.headers, "X-Session-ID": sid}) as resp:
            event = None
            async for raw in resp.content:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event in ("chunk", "end"):
                    data.append(line[5:].lstrip())
        return json.loads("".join(data))["output"]

    async def episode(self, index: int) -> int:
        sid = uuid.uuid4().hex
        headers = {**self.headers, "X-Session-ID": sid}
        async with self.http.post(f"{self.url}/create", json={"env_name": self.name, "split": "train", "index": index},
                                  headers=headers) as resp:
            assert resp.status == 200, await resp.text()
        async with self.http.get(f"{self.url}/{self.name}/prompt", headers=headers) as resp:
            prompt = (await resp.json())[0]["text"]
        value = (await self._call(sid, "calculator", {"expression": _expression(prompt)}))["blocks"][0]["text"]
        out = await self._call(sid, "submit", {"answer": value})
        assert out["reward"] == 1.0 and out["finished"], out
        async with self.http.post(f"{self.url}/delete", headers=headers) as resp:
            await resp.read()
        return 2


class OpenEnvClient:
    """The WebSocket messages of an echo-env episode, on one socket (one session)."""

    def __init__(self, ws: Any, served: bool):
        self.ws, self.served = ws, served

    async def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        await self.ws.send(json.dumps(message))
        reply = json.loads(await self.ws.recv())
        assert reply["type"] == "observation", reply
        return reply["data"]

    async def episode(self, index: int) -> int:
        # The served env picks its task by split and index (task i is the server's reset(seed=i)).
        data = {"split": "default", "index": index} if self.served else {"seed": index}
        await self._ask({"type": "reset", "data": data})
        await self._ask({"type": "step", "data": {"type": "call_tool", "tool_name": "echo", "arguments": {"message": "hi"}}})
        out = await self._ask({"type": "step", "data": {"type": "call_tool", "tool_name": "guess",
                                                        "arguments": {"number": index % 10}}})
        assert out["reward"] == 1.0 and out["done"], out
        return 2


async def drive(episodes: list[Callable[[int], Awaitable[int]]], seconds: float, offset: int) -> tuple[float, int]:
    """One loop of episodes per client for ``seconds`` (episodes under way finish); env-steps/s."""
    stop_at = time.monotonic() + seconds
    counter = iter(range(offset, 10**9))
    totals = [0] * len(episodes)

    async def loop(k: int) -> None:
        while time.monotonic() < stop_at:
            done = await episodes[k](next(counter) % 2000)
            totals[k] += done

    start = time.monotonic()
    await asyncio.gather(*(loop(k) for k in range(len(episodes))))
    return sum(totals) / (time.monotonic() - start), sum(totals)


async def ors_rate(url: str, headers: dict[str, str], clients: int, seconds: float, offset: int) -> tuple[float, int]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        return await drive([ORSClient(http, url, headers).episode for _ in range(clients)], seconds, offset)


async def openenv_rate(url: str, headers: dict[str, str], served: bool, clients: int, seconds: float,
                       offset: int) -> tuple[float, int]:
    from websockets.asyncio.client import connect

    ws_url = url.replace("http://", "ws://") + "/ws"
    sockets = [await connect(ws_url, additional_headers=headers, compression=None, max_size=None)
               for _ in range(clients)]
    try:
        return await drive([OpenEnvClient(ws, served).episode for ws in sockets], seconds, offset)
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)


# -- direct: the same env through Gymnasium, in this process -------------------------------------------------
def arithmetic_action(messages: list[dict[str, Any]]) -> dict[str, Any]:
    last = messages[-1]
    if last["role"] == "tool":
        return _call("submit", {"answer": last["content"]})
    return _call("calculator", {"expression": _expression(last["content"])})


def echo_action(messages: list[dict[str, Any]], index: int, turn: int) -> dict[str, Any]:
    return _call("echo", {"message": "hi"}) if turn == 0 else _call("guess", {"number": index % 10})


def direct_single(env: gym.Env, kind: str, seconds: float, offset: int) -> tuple[float, int]:
    steps, n = 0, offset
    stop_at = time.monotonic() + seconds
    start = time.monotonic()
    while time.monotonic() < stop_at:
        n += 1
        obs, info = env.reset(options={"index": n % 2000})
        for turn in range(2):
            action = arithmetic_action(obs) if kind == "ors" else echo_action(obs, info["index"], turn)
            obs, reward, terminated, truncated, _ = env.step(action)
            steps += 1
        assert reward == 1.0 and terminated
    return steps / (time.monotonic() - start), steps


def direct_vector(envs: Any, kind: str, seconds: float, offset: int) -> tuple[float, int]:
    """First-ready batches of 16 over a SAME_STEP vector env, as a trainer collecting rollouts drives it."""
    n = envs.num_envs
    obs, infos = envs.reset(seed=offset)
    index = [info_at(infos, i)["index"] for i in range(n)]
    turn = [0] * n

    def act(i: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return arithmetic_action(messages) if kind == "ors" else echo_action(messages, index[i], turn[i])

    steps = 0
    stop_at = time.monotonic() + seconds
    start = time.monotonic()
    envs.send([act(i, obs[i]) for i in range(n)])
    in_flight = n
    while in_flight:
        batch = envs.recv(min(16, in_flight))
        in_flight -= len(batch.env_ids)
        ids, actions = [], []
        for k, i in enumerate(batch.env_ids.tolist()):
            steps += 1
            turn[i] += 1
            if batch.terminations[k] or batch.truncations[k]:
                assert batch.rewards[k] == 1.0
                turn[i], index[i] = 0, info_at(batch.infos, k)["index"]
            if time.monotonic() < stop_at:
                ids.append(i), actions.append(act(i, batch.obs[k]))
        if ids:
            envs.send(actions, ids)
            in_flight += len(ids)
    return steps / (time.monotonic() - start), steps


# -- rounds ---------------------------------------------------------------------------------------------------
def ratios(name: str, a: list[float], b: list[float]) -> list[float]:
    out = [x / y for x, y in zip(a, b)]
    print(f"  {name}: median {statistics.median(out):.2f} (min {min(out):.2f}, max {max(out):.2f})", flush=True)
    return out


def run_case(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """One protocol: single and concurrent, served vs native vs direct, in alternating rounds."""
    extra: list[subprocess.Popen] = []
    if kind == "ors":
        served_proc, served_url = start_served("openenv/Arithmetic-v0", "ors", args.sessions, "in_process=true")
        hop_proc, hop_url = start_served("openenv/Arithmetic-v0", "ors", args.sessions)
        extra.append(hop_proc)
        native_proc, native_url = start_native_ors()
        env = gym.make("openenv/Arithmetic-v0", in_process=True)
        envs = gym.make_vec("openenv/Arithmetic-v0", num_envs=args.sessions, autoreset_mode="SameStep", in_process=True)
        sides: dict[str, Callable[[int, int], tuple[float, int]]] = {
            "served": lambda c, o: asyncio.run(ors_rate(served_url, HEADERS, c, args.seconds, o)),
            "served_over_server": lambda c, o: asyncio.run(ors_rate(hop_url, HEADERS, c, args.seconds, o)),
            "native": lambda c, o: asyncio.run(ors_rate(native_url, {}, c, args.seconds, o))}
    else:
        served_proc, served_url = start_served("openenv/OpenEnv-v0", "openenv", args.sessions, f"source={ECHO}",
                                               "in_process=true")
        hop_proc, hop_url = start_served("openenv/OpenEnv-v0", "openenv", args.sessions, f"source={ECHO}")
        extra.append(hop_proc)
        native_proc, native_url = start_native_openenv(args.sessions)
        env = gym.make("openenv/OpenEnv-v0", source=str(ECHO), in_process=True)
        envs = gym.make_vec("openenv/OpenEnv-v0", num_envs=args.sessions, source=str(ECHO), autoreset_mode="SameStep",
                            in_process=True)
        sides = {"served": lambda c, o: asyncio.run(openenv_rate(served_url, HEADERS, True, c, args.seconds, o)),
                 "served_over_server": lambda c, o: asyncio.run(openenv_rate(hop_url, HEADERS, True, c, args.seconds, o)),
                 "native": lambda c, o: asyncio.run(openenv_rate(native_url, {}, False, c, args.seconds, o))}
    sides["direct"] = lambda c, o: (direct_single(env, kind, args.seconds, o) if c == 1
                                    else direct_vector(envs, kind, args.seconds, o))
    cases = {"single": 1, "concurrent": args.sessions}
    rates: dict[str, dict[str, list[float]]] = {c: {s: [] for s in sides} for c in cases}
    cpu: dict[str, dict[str, list[float]]] = {c: {s: [] for s in sides} for c in cases}
    try:
        for side in sides.values():  # warm every path up
            side(1, 0), side(args.sessions, 0)
        for r in range(args.rounds):
            # Served and native side by side, each first in every other round: the figure is
            # their ratio, and on a shared machine the load drifts over a round's 30-odd seconds.
            paired = ["served", "native"] + [name for name in sides if name not in ("served", "native")]
            order = paired if r % 2 == 0 else paired[::-1]
            for case, clients in cases.items():
                for name in order:
                    rate, per_step = measured(lambda name=name, clients=clients, r=r: sides[name](clients, 100 + r * 1000))
                    rates[case][name].append(rate)
                    cpu[case][name].append(per_step)
            print(f"{kind} round {r}: " + " | ".join(
                f"{case} " + " ".join(f"{s} {rates[case][s][-1]:.0f}/s {cpu[case][s][-1]:.0f}us" for s in sides)
                for case in cases) + "  (env-steps/s, CPU per env-step of every process)", flush=True)
    finally:
        env.close()
        envs.close()
        stop(served_proc)
        stop(native_proc)
        for proc in extra:
            stop(proc)
    out: dict[str, Any] = {"rates": rates, "cpu_us_per_step": cpu}
    for case in cases:
        label = "single client" if case == "single" else f"{args.sessions} concurrent sessions"
        print(f"{kind}, {label}:", flush=True)
        out[f"{case}_vs_native"] = ratios("env-steps/s served / native", rates[case]["served"], rates[case]["native"])
        out[f"{case}_vs_direct"] = ratios("env-steps/s served / direct", rates[case]["served"], rates[case]["direct"])
        out[f"{case}_cpu_vs_native"] = ratios("CPU per env-step native / served", cpu[case]["native"], cpu[case]["served"])
        if "served_over_server" in sides:
            out[f"{case}_hop_vs_native"] = ratios("env-steps/s served over its server / native",
                                                  rates[case]["served_over_server"], rates[case]["native"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per side per round")
    parser.add_argument("--rounds", "--reps", dest="rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--sessions", type=int, default=64, help="concurrent sessions (and sub-envs of the direct side)")
    parser.add_argument("--only", default="ors,openenv", help="comma-separated: ors, openenv")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    from figures import figure, write

    figures, details = [], {}
    names = {"ors": ("ORS", "ors-sdk's Server", "Arithmetic, in_process=true"),
             "openenv": ("OpenEnv", "OpenEnv's create_app", "echo env, in_process=true")}
    for kind in args.only.split(","):
        result = run_case(kind, args)
        details[kind] = result
        proto, native, env = names[kind]
        for case, label in (("single", "single client"), ("concurrent", f"{args.sessions} concurrent sessions")):
            rates = result["rates"][case]
            cpu = result["cpu_us_per_step"][case]
            note = (f"{env}; served {statistics.median(rates['served']):.0f}, native {statistics.median(rates['native']):.0f}, "
                    f"direct {statistics.median(rates['direct']):.0f} env-steps/s")
            figures.append(figure(f"{proto} served vs {native}, {label}, env-steps/s", result[f"{case}_vs_native"],
                                  target=0.9, note=note))
            figures.append(figure(f"{proto} served vs {native}, {label}, CPU per env-step (theirs / ours)",
                                  result[f"{case}_cpu_vs_native"],
                                  note=f"all processes; served {statistics.median(cpu['served']):.0f} us, "
                                       f"native {statistics.median(cpu['native']):.0f} us"))
            figures.append(figure(f"{proto} served vs gym.make of the same id, {label}, env-steps/s",
                                  result[f"{case}_vs_direct"]))
            if f"{case}_hop_vs_native" in result:
                figures.append(figure(
                    f"{proto} served over the env's own server (no in_process) vs {native}, {label}, env-steps/s",
                    result[f"{case}_hop_vs_native"],
                    note=f"served over its server {statistics.median(rates['served_over_server']):.0f} env-steps/s"))
    write(args.json, figures, {"details": details, "args": {k: v for k, v in vars(args).items() if k != "json"}})


if __name__ == "__main__":
    main()
