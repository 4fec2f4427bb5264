"""openenv_gym.trl.EnvSpec side by side with TRL's own OpenRewardSpec, on the same ORS server.

The server is the bundled Arithmetic env served by the ``openreward`` SDK's own server on a
127.0.0.1 port (TRL's spec speaks through the ``openreward`` client, whose task calls need that
server's replies; the env's logic is the bundled one, delegated to). Both specs point at its URL
(``EnvSpec("openenv/ORS-v0", url=..., env_name="arithmetic")`` and
``OpenRewardSpec(url, env_name="arithmetic")``), and the script checks, before timing anything:

* the same number of dataset rows for the same ``num_tasks``;
* the same tool schemas, as TRL reads them (``transformers.utils.get_json_schema`` on each
  environment's tool methods);
* the same rewards for the same scripted rollouts (calculator, then submit, right or wrong):
  ours from ``get_reward()``, theirs from their ``reward_funcs``.

Then the figures: tool-call throughput with 64 environment instances, each reset on its own task,
their calculator calls made from 64 threads at once (as TRL's async GRPO worker runs sync tools on
a thread pool), in rounds whose sides alternate; the ratio is ours / theirs per round (target >=
1.0), median and min-max. Both sides share the server, so the client's own cost is measured too:
this process's CPU time per call (every thread's; the server is another process). It needs TRL:
run from a venv without it, the script runs itself under ``.venv-trl/bin/python`` (built by
``.ci/trl.sh``) if that exists.

    python benchmarks/trl_spec.py [--reps 5] [--instances 64] [--calls 20] [--json out.json]
"""

import argparse
import concurrent.futures
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV_PYTHON = HERE.parent / ".venv-trl" / "bin" / "python"
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")  # no PyPI check from the SDK
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def serve(port: int) -> None:
    """The bundled Arithmetic env under the openreward SDK's server (its logic delegated to).

    The SDK reads the tools' type hints, so they are objects here (no ``from __future__ import
    annotations`` in this file): the classes they name are local to this function."""
    from openreward.environments import Environment, Server, Split, TextBlock, ToolOutput, tool

    from openenv_gym.examples import arithmetic as bundled

    def twin(out: Any) -> ToolOutput:
        return ToolOutput(blocks=[TextBlock(text=b.text) for b in out.blocks], reward=out.reward,
                          finished=out.finished, metadata=out.metadata)

    class Arithmetic(Environment):
        """Compute an integer expression, optionally with a calculator, then submit the answer."""

        # `task_spec: dict = {}, secrets: dict = {}` is the ORS SDK's own Environment signature.
        def __init__(self, task_spec: dict[str, Any] = {}, secrets: dict[str, str] = {}) -> None:  # noqa: B006
            super().__init__(task_spec=task_spec, secrets=secrets)
            self.inner = bundled.Arithmetic(task_spec=task_spec, secrets=secrets)

        @classmethod
        def list_splits(cls) -> list[Split]:
            return [Split(name=s, type=s) for s in bundled.SPLIT_SIZES]

        @classmethod
        def list_tasks(cls, split: str) -> list[dict[str, str]]:
            return bundled.Arithmetic.list_tasks(split)

        def get_prompt(self) -> list[TextBlock]:
            return [TextBlock(text=b.text) for b in self.inner.get_prompt()]

        @tool
        def calculator(self, params: bundled.CalculatorInput) -> ToolOutput:
            """Evaluate an arithmetic expression (+ - * / // % **, parentheses). Not an answer."""
            return twin(self.inner.calculator(params))

        @tool
        def submit(self, params: bundled.SubmitInput) -> ToolOutput:
            """Submit the final integer answer. Ends the episode."""
            return twin(self.inner.submit(params))

    Server([Arithmetic]).run(host="127.0.0.1", port=port)


def question(prompt: str) -> str:
    return prompt.split("Compute ", 1)[1].split(". ", 1)[0]


def checks(ours: Any, theirs: Any, tasks: int) -> dict[str, Any]:
    """Rows, schemas and rewards of both specs; raises AssertionError if they differ."""
    from transformers.utils import get_json_schema

    rows = (len(ours.train_dataset), len(theirs.train_dataset))
    assert rows[0] == rows[1] == tasks, rows
    a, b = ours.environment_factory(), theirs.environment_factory()
    schemas = {name: (get_json_schema(getattr(a, name)), get_json_schema(getattr(b, name)))
               for name in ("calculator", "submit")}
    for name, (mine, other) in schemas.items():
        assert mine == other, (name, mine, other)
    rewards: dict[str, list[float]] = {"ours": [], "theirs": [], "expected": []}
    for k in range(tasks):
        for side, spec, env in (("ours", ours, a), ("theirs", theirs, b)):
            value = env.calculator(expression=question(env.reset(**spec.train_dataset[k])))
            env.submit(answer=value if k % 2 else str(int(value) + 1))
            rewards[side].append(env.get_reward() if side == "ours" else theirs.reward_funcs(environments=[env])[0])
        rewards["expected"].append(float(k % 2))
    assert rewards["ours"] == rewards["theirs"] == rewards["expected"], rewards
    return {"rows": rows, "tools": sorted(schemas), "rewards": rewards["ours"]}


def throughput(spec: Any, envs: list[Any], calls: int, pool: concurrent.futures.Executor) -> tuple[float, float]:
    """Tool calls per second, and this process's CPU seconds per call (every thread's: the callers'
    and the client's event loop; the server is another process): every instance reset on its own
    task, then ``calls`` calculator calls each, from as many threads as instances."""
    expressions = [question(env.reset(**spec.train_dataset[k % len(spec.train_dataset)])) for k, env in enumerate(envs)]

    def work(k: int) -> None:
        for _ in range(calls):
            envs[k].calculator(expression=expressions[k])

    start, cpu = time.perf_counter(), time.process_time()
    list(pool.map(work, range(len(envs))))
    n = len(envs) * calls
    return n / (time.perf_counter() - start), (time.process_time() - cpu) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="rounds (sides alternate)")
    parser.add_argument("--instances", type=int, default=64, help="environment instances per side")
    parser.add_argument("--calls", type=int, default=20, help="calculator calls per instance per round")
    parser.add_argument("--tasks", type=int, default=32, help="dataset rows, and rollouts checked for rewards")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve)
    if importlib.util.find_spec("trl") is None:
        if VENV_PYTHON.exists() and Path(sys.prefix).resolve() != VENV_PYTHON.parents[1].resolve():
            os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), __file__, *sys.argv[1:]])
        raise SystemExit("needs TRL: build its venv with `bash .ci/trl.sh` (.venv-trl), or install the trl extra")

    sys.path.insert(0, str(HERE))
    from figures import figure, write
    from servers import free_port, wait_healthy
    from trl.experimental.openreward import OpenRewardSpec

    import openenv_gym  # noqa: F401
    from openenv_gym.testing import procs
    from openenv_gym.trl import EnvSpec

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    os.environ["OPENREWARD_SESSION_URL"] = url  # the openreward client's session host (not a subdomain)
    try:
        wait_healthy(proc, url, "Arithmetic")
        ours = EnvSpec("openenv/ORS-v0", url=url, env_name="arithmetic", num_tasks=args.tasks)
        theirs = OpenRewardSpec(url, env_name="arithmetic", num_tasks=args.tasks)
        try:
            checked = checks(ours, theirs, args.tasks)
            print(f"same rows ({checked['rows'][0]}), same tool schemas ({', '.join(checked['tools'])}), "
                  f"same rewards for {args.tasks} scripted rollouts", flush=True)
            sides = {"openenv_gym EnvSpec": (ours, [ours.environment_factory() for _ in range(args.instances)]),
                     "TRL OpenRewardSpec": (theirs, [theirs.environment_factory() for _ in range(args.instances)])}
            rates: dict[str, list[float]] = {name: [] for name in sides}
            cpu: dict[str, list[float]] = {name: [] for name in sides}
            with concurrent.futures.ThreadPoolExecutor(args.instances) as pool:
                for spec, envs in sides.values():
                    throughput(spec, envs, 2, pool)  # warm every path up
                for r in range(args.reps):
                    for name in (sides if r % 2 == 0 else reversed(list(sides))):
                        rate, seconds = throughput(*sides[name], args.calls, pool)
                        rates[name].append(rate)
                        cpu[name].append(seconds)
                    print(f"  round {r}: " + "   ".join(f"{k} {rates[k][-1]:7.0f} calls/s ({cpu[k][-1] * 1e6:,.0f} us CPU "
                                                        "a call)" for k in sides), flush=True)
            for _, envs in sides.values():
                for env in envs:
                    close = getattr(env, "_close", None)
                    if close is not None:
                        close()
        finally:
            ours.close()
    finally:
        procs.terminate(proc)
    mine, other = rates["openenv_gym EnvSpec"], rates["TRL OpenRewardSpec"]
    mine_cpu, other_cpu = cpu["openenv_gym EnvSpec"], cpu["TRL OpenRewardSpec"]
    figures = [
        figure(f"EnvSpec vs TRL's OpenRewardSpec: tool calls/s, {args.instances} instances from "
               f"{args.instances} threads, same server", [a / b for a, b in zip(mine, other)], target=1.0),
        figure("EnvSpec tool calls/s", mine, unit="calls/s"),
        figure("OpenRewardSpec tool calls/s", other, unit="calls/s"),
        figure("client CPU per tool call, EnvSpec vs OpenRewardSpec (lower: cheaper)",
               [a / b for a, b in zip(mine_cpu, other_cpu)], higher_is_better=False),
        figure("client CPU per tool call: EnvSpec", [c * 1e6 for c in mine_cpu], unit="us"),
        figure("client CPU per tool call: OpenRewardSpec", [c * 1e6 for c in other_cpu], unit="us"),
    ]
    for f in figures:
        print(f"{f['name']}: {f['median']:.2f} ({f['min']:.2f} - {f['max']:.2f})")
    write(args.json, figures, {"rates": rates, "cpu_seconds_per_call": cpu, "checks": checked})


if __name__ == "__main__":
    main()
