"""Scale: how many concurrent sessions of 1-second steps a configuration holds, OpenEnv's way.

The shape of OpenEnv's scaling harness (``tutorial/03-scaling.md``): every step takes
``--step`` seconds (1.0) in the env; sessions double from ``--sizes``' first to its last (32 to
65,536); each size runs ``--seconds`` of steady stepping after every session has reset, and
counts when at least 95% of its sessions had at least 95% of their steps succeed. A system stops
at its first size below that, and the row says why (the commonest error, or what ran out).

Systems (``--systems`` picks some), each size in a fresh process of its own:

* ``vector``: ``gym.make_vec("openenv/ORS-v0", num_envs=N, source=...)`` with default arguments
  over an ORS env of the test suite (``tests/envs/ors_probe.py``, its ``slow`` tool), served by
  the SDK's own local servers that the vector env starts; first-ready ``send``/``recv`` in
  batches of N/64, as a trainer collects rollouts.
* ``in_process``: the same with ``in_process=True`` (the env class on the vector env's loop).
* ``openenv``: the baseline, OpenEnv's own: its ``create_app`` server under uvicorn (one
  process, as OpenEnv runs it) with an env whose ``step_async`` sleeps
  (``benchmarks/envs/openenv_sleep_env``), driven by N of OpenEnv's ``GenericEnvClient``s
  gathered on one event loop.
* ``ours_openenv``: ``gym.make_vec("openenv/OpenEnv-v0", url=..., num_envs=N)`` against that
  same OpenEnv server: our client on OpenEnv's protocol.
* ``serve_openenv``: ``openenv-gym serve`` of that same env (``in_process=true``) over OpenEnv's
  WebSocket protocol, driven by OpenEnv's own clients as ``openenv`` is (``MCPToolClient``: the
  served env offers tools): the server against OpenEnv's ``create_app``, the same env.
* ``serve_ors``: the same server over ORS, driven by our vector env (``url=``), a connection per
  session.
* ``ray_cluster``: two Ray nodes on this machine (``ray start`` twice, a head on 127.0.0.2 and a
  worker on 127.0.0.3, one CPU each, a token of the run's; :mod:`openenv_gym.testing.ray_cluster`)
  and ``gym.make_vec(..., backend="ray", in_process=True)`` joining them by address with one actor
  on each node (``actor_options={"num_cpus": 1}``); the row says what each node held and stepped.

Every session steps once before the window opens (at 16,384 sessions the first round alone takes
longer than the window). Per size: steps/s (requests/s: one request per step), the share of steps and of sessions that
succeeded, p50/p99 step latency (send to result), peak RSS and CPU (cores busy over the window)
of the client process and of the servers it started. The machine is shared: every run records
the cores busy outside these processes meanwhile.

    python benchmarks/scale.py [--systems vector,in_process,openenv,ours_openenv] [--sizes 32-65536]
                               [--seconds 20] [--step 1.0] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "envs" / "ors_probe.py"
ENVS = Path(__file__).resolve().parent / "envs"
SYSTEMS = ("vector", "in_process", "openenv", "ours_openenv", "serve_openenv", "serve_ors", "ray_cluster")
COUNTS = 0.95
"""A step share and a session share: a size counts when 95% of sessions had 95% of steps succeed."""
_HZ = os.sysconf("SC_CLK_TCK")


# -- what the processes spent ------------------------------------------------------------------------
def _ticks(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _HZ
    except (OSError, IndexError):
        return 0.0


def _peak_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _machine_busy() -> float:
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _HZ


def _descendants() -> list[int]:
    from openenv_gym.processes import descendants

    return descendants()


class Window:
    """CPU of this process and of its children, and of the whole machine, over the measured window."""

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.cpu0 = time.process_time()
        self.kids = {pid: _ticks(pid) for pid in _descendants()}
        self.busy0 = _machine_busy()

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self.t0
        client = (time.process_time() - self.cpu0) / wall
        servers = sum(_ticks(pid) - before for pid, before in self.kids.items()) / wall
        others = max(0.0, (_machine_busy() - self.busy0) / wall - client - servers)
        return {"wall": wall, "client_cores": client, "server_cores": servers, "other_cores": others,
                "client_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "server_peak_mib": sum(_peak_mib(pid) for pid in self.kids)}


def _summary(latencies: list[float], ok: collections.Counter, bad: collections.Counter, sessions: int,
             errors: collections.Counter, window: dict[str, float], seconds: float) -> dict[str, Any]:
    """One size's row: steps are those whose results arrived within the ``seconds`` measured."""
    latencies.sort()
    steps = sum(ok.values()) + sum(bad.values())
    good_sessions = sum(1 for s in range(sessions) if ok[s] and ok[s] >= COUNTS * (ok[s] + bad[s]))

    def pct(q: float) -> float | None:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else None

    return {"sessions": sessions, "steps": steps, "steps_per_s": sum(ok.values()) / seconds,
            "step_success": sum(ok.values()) / steps if steps else 0.0, "session_success": good_sessions / sessions,
            "p50": pct(0.50), "p99": pct(0.99), "errors": dict(errors.most_common(3)), **window}


# -- our vector env ---------------------------------------------------------------------------------------
def run_vector(system: str, n: int, seconds: float, step: float, url: str | None = None,
               headers: dict[str, str] | None = None, cluster: Any = None) -> dict[str, Any]:
    import gymnasium as gym

    import openenv_gym  # noqa: F401  (registers the ids)

    if system == "serve_ors":
        envs = gym.make_vec("openenv/ORS-v0", num_envs=n, url=url, headers=headers)
        action: Any = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "s", "type": "function", "function": {"name": "step", "arguments": json.dumps({"text": "hi"})}}]}
    elif system == "ours_openenv":
        envs = gym.make_vec("openenv/OpenEnv-v0", num_envs=n, url=url)
        action = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "s", "type": "function", "function": {"name": "step", "arguments": json.dumps({"text": "hi"})}}]}
    else:
        where: dict[str, Any] = {}
        if system == "in_process":
            where = {"in_process": True}
        elif cluster is not None:  # one actor on each node: each node offers one CPU, each actor asks one
            where = {"in_process": True, "backend": "ray", "vector_options": {
                "address": cluster.address, "num_actors": 2, "actor_options": {"num_cpus": 1}}}
        envs = gym.make_vec("openenv/ORS-v0", num_envs=n, source=str(PROBE), env_class="Probe", **where)
        action = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "s", "type": "function", "function": {"name": "slow", "arguments": json.dumps({"seconds": step})}}]}
    try:
        t0 = time.perf_counter()
        _, infos = envs.reset(seed=0)
        reset_s = time.perf_counter() - t0
        errors: collections.Counter = collections.Counter()
        if "error" in infos:
            for message, failed in zip(infos["error"]["message"], infos["_error"]):
                if failed:
                    errors["reset: " + str(message)[:160]] += 1
        ok: collections.Counter = collections.Counter()
        bad: collections.Counter = collections.Counter()
        latencies: list[float] = []
        sent = [0.0] * n
        batch = max(1, n // 64)
        envs.send([action] * n)  # warm-up: every session steps once before the window opens
        sent = [time.perf_counter()] * n
        warm = n
        while warm:
            got = envs.recv(batch_size=min(warm, batch), timeout=max(120.0, 4 * step))
            warm -= len(got.env_ids)
            envs.send([action] * len(got.env_ids), got.env_ids)
            now = time.perf_counter()
            for i in got.env_ids.tolist():
                sent[i] = now
        window = Window()
        window.start()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            got = envs.recv(batch_size=batch, timeout=max(60.0, 4 * step))
            now = time.perf_counter()
            ids = got.env_ids.tolist()
            failed = got.infos["_error"] if "error" in got.infos else [False] * len(ids)
            for k, i in enumerate(ids):
                if now > end:
                    break
                if failed[k] or got.truncations[k]:
                    bad[i] += 1
                    if "error" in got.infos and failed[k]:
                        errors[str(got.infos["error"]["message"][k])[:160]] += 1
                else:
                    ok[i] += 1
                    latencies.append(now - sent[i])
            for i in ids:
                sent[i] = now
            envs.send([action] * len(ids), ids)
        measured = window.stop()
        nodes = _per_node(envs, cluster, ok, seconds) if cluster is not None else None
    finally:
        envs.close()
    row = {**_summary(latencies, ok, bad, n, errors, measured, seconds), "reset_s": reset_s}
    return {**row, "nodes": nodes} if nodes is not None else row


def _per_node(envs: Any, cluster: Any, ok: collections.Counter, seconds: float) -> dict[str, dict[str, Any]]:
    """What each node of the cluster held (sessions) and stepped (steps/s), by its actors' PIDs
    (sub-env ``i`` lives in actor ``i % num_actors``)."""
    import ray

    pids = ray.get([actor.pid.remote() for actor in envs.actors])
    nodes: dict[str, dict[str, Any]] = {}
    for k, pid in enumerate(pids):
        node = nodes.setdefault(str(cluster.node_of(pid)), {"actors": 0, "sessions": 0, "steps_per_s": 0.0})
        held = range(k, envs.num_envs, len(pids))
        node["actors"] += 1
        node["sessions"] += len(held)
        node["steps_per_s"] += sum(ok[i] for i in held) / seconds
    return nodes


def _dies_with_us() -> Any:
    """A ``preexec_fn`` that has the kernel stop the child when this process dies (a size the sweep
    kills for its timeout must not leave its server running)."""
    import functools

    from openenv_gym.processes import die_with_parent

    return functools.partial(die_with_parent, os.getpid())


# -- OpenEnv's own server and client -----------------------------------------------------------------------
def start_openenv_server(step: float, n: int) -> tuple[subprocess.Popen, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from servers import free_port, wait_healthy

    port = free_port()
    env = dict(os.environ, SLEEP_ENV_SECONDS=str(step), MAX_CONCURRENT_ENVS=str(max(n, 1)), ENABLE_WEB_INTERFACE="false")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "openenv_sleep_env.server.app:app", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning"],
        cwd=str(ENVS), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_dies_with_us())
    return wait_healthy(proc, f"http://127.0.0.1:{port}", "OpenEnv")


async def _openenv_clients(url: str, n: int, seconds: float, headers: dict[str, str], mcp: bool) -> dict[str, Any]:
    """N of OpenEnv's own clients on one loop: ``GenericEnvClient`` for an env of typed actions,
    ``MCPToolClient`` for one of tools (what ``serve`` offers over OpenEnv's protocol)."""
    from openenv.core.generic_client import GenericEnvClient
    from openenv.core.mcp_client import MCPToolClient

    clients: list[Any] = [MCPToolClient(base_url=url, headers=headers) if mcp else GenericEnvClient(base_url=url)
                          for _ in range(n)]
    errors: collections.Counter = collections.Counter()
    alive = [True] * n

    async def opened(k: int) -> None:
        try:
            await clients[k].connect()
            await clients[k].reset()
        except Exception as exc:  # noqa: BLE001  (the harness counts failures, as OpenEnv's does)
            alive[k] = False
            errors[f"reset: {type(exc).__name__}: {str(exc)[:120]}"] += 1

    async def step(k: int) -> None:
        await (clients[k].call_tool("step", text="hi") if mcp else clients[k].step({"text": "hi"}))

    t0 = time.perf_counter()
    await asyncio.gather(*(opened(k) for k in range(n)))
    reset_s = time.perf_counter() - t0

    # Every session steps on from its first step; the window opens once each has finished one
    # (as on our side, the steps then in flight count when they end within it).
    live = sum(alive)
    ok: collections.Counter = collections.Counter()
    bad: collections.Counter = collections.Counter()
    latencies: list[float] = []
    first: set[int] = set()
    window = Window()
    bounds: list[float] = []  # [start, end] once open

    async def play(k: int) -> None:
        if not alive[k]:
            bad[k] += 1
            return
        while not bounds or time.perf_counter() < bounds[1]:
            sent = time.perf_counter()
            try:
                await step(k)
                failed = None
            except Exception as exc:  # noqa: BLE001  (the harness counts failures, as OpenEnv's does)
                failed = exc
            done = time.perf_counter()
            if not bounds:
                first.add(k)
                if len(first) == live:
                    window.start()
                    bounds.extend((done, done + seconds))
            elif done <= bounds[1]:
                if failed is None:
                    ok[k] += 1
                    latencies.append(done - sent)
                else:
                    bad[k] += 1
            if failed is not None:
                errors[f"{type(failed).__name__}: {str(failed)[:120]}"] += 1
                if not bounds:
                    bad[k] += 1
                return

    await asyncio.gather(*(play(k) for k in range(n)))
    if not bounds:  # no session got as far as a step
        window.start()
    measured = window.stop()
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return {**_summary(latencies, ok, bad, n, errors, measured, seconds), "reset_s": reset_s}


def start_served(protocol: str, step: float, n: int) -> tuple[subprocess.Popen, str, dict[str, str]]:
    """``openenv-gym serve`` of the sleep env, in process, over ``protocol``; its URL and the headers
    that carry its token."""
    import secrets

    import httpx

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from servers import free_port

    token = secrets.token_urlsafe(32)
    headers = {"Authorization": f"Bearer {token}"}
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "openenv_gym.cli", "serve", "openenv/OpenEnv-v0", f"source={ENVS / 'openenv_sleep_env'}",
         "in_process=true", "--protocol", protocol, "--port", str(port), "--max-sessions", str(n + 8)],
        env=dict(os.environ, OPENENV_GYM_TOKEN=token, SLEEP_ENV_SECONDS=str(step)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_dies_with_us())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", headers=headers, timeout=1.0).status_code == 200:
                return proc, url, headers
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("openenv-gym serve did not start")


def run_cluster(n: int, seconds: float, step: float) -> dict[str, Any]:
    """Two Ray nodes started here (they die with this process), joined by the vector env."""
    from openenv_gym.testing.ray_cluster import Cluster, cluster_env

    os.environ.update(cluster_env())  # before Ray is imported: it reads the token and mode once
    cluster = Cluster(dict(os.environ), preexec_fn=_dies_with_us())
    try:
        return run_vector("ray_cluster", n, seconds, step, cluster=cluster)
    finally:
        cluster.stop()


def run_one(system: str, n: int, seconds: float, step: float) -> dict[str, Any]:
    from openenv_gym.processes import ensure_open_files, terminate

    if system in ("vector", "in_process"):
        return run_vector(system, n, seconds, step)
    if system == "ray_cluster":
        return run_cluster(n, seconds, step)
    ensure_open_files(n + 256, f"{n} sessions")  # OpenEnv's client opens a socket each, as ours does
    headers: dict[str, str] = {}
    if system.startswith("serve_"):
        proc, url, headers = start_served(system.removeprefix("serve_"), step, n)
    else:
        proc, url = start_openenv_server(step, n)
    try:
        if system in ("openenv", "serve_openenv"):
            return asyncio.run(_openenv_clients(url, n, seconds, headers, mcp=system == "serve_openenv"))
        return run_vector(system, n, seconds, step, url=url, headers=headers)
    finally:
        terminate(proc)


# -- the sweep -----------------------------------------------------------------------------------------------
def _sizes(spec: str) -> list[int]:
    if "-" in spec:
        low, high = (int(x) for x in spec.split("-"))
        sizes = []
        while low <= high:
            sizes.append(low)
            low *= 2
        return sizes
    return [int(x) for x in spec.split(",")]


def _why(row: dict[str, Any]) -> str:
    if row.get("failed"):
        return row["failed"]
    if row["errors"]:
        return "errors: " + "; ".join(f"{k} (x{v})" for k, v in row["errors"].items())
    if row["client_cores"] + row["server_cores"] + row["other_cores"] > 0.9 * (os.cpu_count() or 1):
        return "CPU: every core busy, steps waited past the window"
    return "steps did not finish within the window"


def sweep(system: str, sizes: list[int], seconds: float, step: float, timeout: float) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        cmd = [sys.executable, __file__, "--one", system, str(n), "--seconds", str(seconds), "--step", str(step)]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            row = json.loads(lines[-1]) if lines else {"failed": (out.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        except subprocess.TimeoutExpired:
            row = {"failed": f"did not finish within {timeout:.0f} s"}
        row.update(system=system, size=n)
        rows.append(row)
        if row.get("failed"):
            print(f"{system:<12} {n:>6}  failed: {row['failed']}", flush=True)
            break
        print(f"{system:<12} {n:>6}  {row['steps_per_s']:8.0f} steps/s  steps ok {100 * row['step_success']:5.1f}%  "
              f"sessions ok {100 * row['session_success']:5.1f}%  p50 {row['p50'] or float('nan'):6.2f} s  "
              f"p99 {row['p99'] or float('nan'):6.2f} s  reset {row['reset_s']:6.1f} s  "
              f"client {row['client_cores']:.2f} cores {row['client_peak_mib']:6.0f} MiB  "
              f"servers {row['server_cores']:.2f} cores {row['server_peak_mib']:6.0f} MiB  "
              f"others {row['other_cores']:.2f}", flush=True)
        for node, held in (row.get("nodes") or {}).items():
            print(f"{'':<12} {'':>6}  node {node}: {held['actors']} actor(s), {held['sessions']} sessions, "
                  f"{held['steps_per_s']:.0f} steps/s", flush=True)
        if row["session_success"] < COUNTS:
            row["stopped"] = _why(row)
            print(f"{system:<12} stops at {n}: {row['stopped']}", flush=True)
            break
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--sizes", default="32-65536", help="'LOW-HIGH' (doubling) or a comma list")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window per size")
    parser.add_argument("--step", type=float, default=1.0, help="seconds every step takes in the env")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one size may take, start to end")
    parser.add_argument("--json")
    parser.add_argument("--one", nargs=2, metavar=("SYSTEM", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]), args.seconds, args.step)), flush=True)
        return
    print(f"scale: {args.step:.1f} s steps, {args.seconds:.0f} s per size, {os.cpu_count()} cores, "
          f"open files {resource.getrlimit(resource.RLIMIT_NOFILE)}", flush=True)
    rows = []
    for system in args.systems.split(","):
        if system not in SYSTEMS:
            raise SystemExit(f"unknown system {system!r}; use {', '.join(SYSTEMS)}")
        rows += sweep(system, _sizes(args.sizes), args.seconds, args.step, args.timeout)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
