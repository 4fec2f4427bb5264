"""The ``openenv-gym`` command: import sources, list and inspect ids, collect rollouts.

    openenv-gym import SOURCE --name NAME [--kind ors|fleet] [--env-class CLS]
    openenv-gym list
    openenv-gym info ID
    openenv-gym remove NAME
    openenv-gym rollout ID --episodes N [--num-envs 32] [--backend concurrent|ray]
                        [--policy random|openai --base-url URL --model M] [--out traj.jsonl]
    openenv-gym bench ID --num-envs 1,8,64 --backend concurrent,ray,sync,async [--plot out.png]

Errors the user can fix (a missing source, nothing detected, an ambiguous source, a bad name)
print one clear line and exit with status 2; nothing is half-written to the catalog.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from openenv_gym.errors import ConfigurationError, OpenEnvGymError

__all__ = ["main"]


def _cmd_import(args: argparse.Namespace) -> int:
    from openenv_gym.importers import import_source
    from openenv_gym.registration import env_id

    entry = import_source(args.source, args.name, kind=args.kind, env_class=args.env_class)
    what = entry.env_class or f"task set of {entry.env_name}"
    print(f"imported {entry.kind} environment {what} from {entry.source}")
    print(f'registered {env_id(entry.name)}: gym.make("{env_id(entry.name)}") after `import openenv_gym`')
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from openenv_gym.registration import env_info, list_environments

    for id in list_environments():
        kwargs = env_info(id)["kwargs"]
        where = kwargs.get("source") or kwargs.get("url") or "(kwargs: url= or source=)"
        print(f"{id:<32} {where}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from openenv_gym.registration import env_info

    print(json.dumps(env_info(args.id), indent=2, default=str))
    return 0


def _cmd_remove(args: argparse.Namespace) -> int:
    from openenv_gym.importers.catalog import remove_entry

    entry = remove_entry(args.name)
    print(f"removed {entry.name} ({entry.source})")
    return 0


def _cmd_rollout(args: argparse.Namespace) -> int:
    from openenv_gym.rollout import collect

    policy: object = "random"
    if args.policy == "openai":
        from openenv_gym.policies import OpenAIPolicy

        if not args.base_url or not args.model:
            raise ConfigurationError("--policy openai needs --base-url and --model")
        policy = OpenAIPolicy(args.base_url, args.model)
    try:
        summary = collect(args.id, args.episodes, num_envs=args.num_envs, backend=args.backend, policy=policy,
                          seed=args.seed, batch_size=args.batch_size, out=args.out, progress=not args.quiet)
    finally:
        if policy != "random":
            policy.close()  # type: ignore[attr-defined]
    print(summary.table())
    if args.out:
        print(f"episodes written to {args.out}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from openenv_gym.bench import bench, plot, table

    sizes = [int(x) for x in args.num_envs.split(",")]
    backends = [b.strip() for b in args.backend.split(",")]
    rows = bench(args.id, sizes, backends, rounds=args.rounds, seed=args.seed)
    print(table(rows))
    if args.json:
        Path(args.json).write_bytes(msgspec.json.encode(rows))
        print(f"results written to {args.json}")
    if args.plot:
        plot(rows, args.plot, title=args.id)
        print(f"plot written to {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openenv-gym", description="Any LLM-agent environment as a Gymnasium env.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("import", help="detect a source statically and add it to your catalog")
    p.add_argument("source", help="a file or folder")
    p.add_argument("--name", required=True, help="registers openenv/NAME-v0")
    p.add_argument("--kind", default=None, help="the source's kind (default: detected): ors or fleet")
    p.add_argument("--env-class", default=None, help="the Environment class, when the source has several")
    p.set_defaults(fn=_cmd_import)

    p = sub.add_parser("list", help="list the registered openenv ids")
    p.set_defaults(fn=_cmd_list)

    p = sub.add_parser("info", help="show what an id is")
    p.add_argument("id")
    p.set_defaults(fn=_cmd_info)

    p = sub.add_parser("remove", help="remove an imported source from your catalog")
    p.add_argument("name")
    p.set_defaults(fn=_cmd_remove)

    p = sub.add_parser("rollout", help="collect episodes with a policy over a vector env")
    p.add_argument("id")
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--num-envs", type=int, default=8, help="sub-envs stepped at once")
    p.add_argument("--backend", choices=("concurrent", "ray"), default="concurrent")
    p.add_argument("--batch-size", type=int, default=None, help="first-ready batch size (default: num_envs/4)")
    p.add_argument("--policy", choices=("random", "openai"), default="random")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write episodes as JSONL")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=_cmd_rollout)

    p = sub.add_parser("bench", help="env-steps/sec over num_envs x backends, Gymnasium's vectorizers included")
    p.add_argument("id")
    p.add_argument("--num-envs", default="1,8,64", help="comma-separated sub-env counts")
    p.add_argument("--backend", default="concurrent,sync,async", help="comma-separated: concurrent,ray,sync,async")
    p.add_argument("--rounds", type=int, default=20, help="lockstep steps per configuration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the rows as JSON")
    p.add_argument("--plot", default=None, help="write a PNG plot (needs matplotlib)")
    p.set_defaults(fn=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.command in ("list", "info", "rollout", "bench"):
        import openenv_gym  # noqa: F401  (registers the ids these commands look up)
    try:
        return args.fn(args)
    except OpenEnvGymError as exc:
        print(f"openenv-gym: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
