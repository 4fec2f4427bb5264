"""The ``openenv-gym`` command: import sources, list and inspect ids, collect rollouts.

    openenv-gym import SOURCE --name NAME [--kind ors|fleet|verifiers] [--env-class CLS]
                       [--isolated [--python 3.12] [--no-build] [--include PATH ...]]
    openenv-gym install git+https://HOST/REPO[@REV][#subdirectory=PATH] | FOLDER | NAME==VERSION --name NAME [--yes]
                        [--include PATH ...]
    openenv-gym list
    openenv-gym info ID
    openenv-gym remove NAME | --invalid
    openenv-gym rollout ID [KEY=VALUE ...] --episodes N [--num-envs 32] [--backend concurrent|ray] [--group-size K [--drop-equal]]
                        [--policy random|openai --base-url URL --model M] [--out traj.jsonl [--append|--overwrite]]
    openenv-gym bench ID --num-envs 1,8,64 --backend concurrent,ray,sync,async [--plot out.png]
    openenv-gym view FILE... [--html OUT] [--port N]
    openenv-gym play ID [--port N] [--out FILE] [--seat SEAT [--opponent-url URL --opponent-model M]] [KEY=VALUE ...]
    openenv-gym serve ID [KEY=VALUE ...] [--protocol ors|openenv] [--port N | --uds PATH] [--max-sessions N]

Errors the user can fix (a missing source, nothing detected, an ambiguous source, a bad name, an
unknown id, a missing extra, an ``--out`` that cannot be written) print one clear line and exit
with status 2, before anything runs; nothing is half-written to the catalog. Every error line goes
through :func:`~openenv_gym.redact.redact_urls`: no URL credential reaches the terminal. Ctrl-C
prints ``interrupted`` and exits with 130; a reader that closed the pipe (``| head``) ends the
command quietly with 141.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from openenv_gym.errors import ConfigurationError, OpenEnvGymError
from openenv_gym.redact import redact_kwargs, redact_urls
from openenv_gym.version import __version__

if TYPE_CHECKING:
    from openenv_gym.policies import Policy

__all__ = ["main", "build_parser"]

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd command
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a command whose reader closed the pipe


def _cmd_import(args: argparse.Namespace) -> int:
    from openenv_gym.importing import import_source
    from openenv_gym.isolation.snapshot import including
    from openenv_gym.registration import env_id

    if args.include and not args.isolated:
        raise ConfigurationError("--include picks left-out files for the snapshot of an isolated import: add --isolated")
    if args.isolated and not args.no_build:
        print("building its venv with uv (once per set of requirements; minutes the first time) ...", file=sys.stderr)
    with including(args.include):
        entry = import_source(args.source, args.name, kind=args.kind, env_class=args.env_class,
                              isolated=args.isolated, python=args.python, build=not args.no_build)
    what = entry.env_class or f"task set of {entry.env_name}"
    print(f"imported {entry.kind} environment {what} from {entry.origin or entry.source}")
    if entry.isolated is not None:
        _print_isolation(entry)
    print(f'registered {env_id(entry.name)}: gym.make("{env_id(entry.name)}") after `import openenv_gym`')
    return 0


def _cmd_install(args: argparse.Namespace) -> int:
    from openenv_gym.install import install
    from openenv_gym.registration import env_id

    entry = install(args.source, args.name, yes=args.yes, kind=args.kind, env_class=args.env_class,
                    python=args.python, build=not args.no_build, include=args.include)
    print(f"installed {entry.kind} environment {entry.env_class or entry.env_name} from {entry.origin}"
          + (f" at commit {entry.commit}" if entry.commit else ""))
    _print_isolation(entry)
    print(f'registered {env_id(entry.name)}: gym.make("{env_id(entry.name)}") after `import openenv_gym`')
    return 0


def _print_isolation(entry: Any) -> None:
    """What an isolated import recorded: the snapshot, what it left out, the venv and its requirements."""
    from openenv_gym.isolation.snapshot import INCLUDE_HINT

    iso = entry.isolated
    print(f"snapshot: {entry.source}")
    if iso.excluded:
        print(f"left out of the snapshot: {', '.join(iso.excluded)}")
        print(f"  ({INCLUDE_HINT})")
    print(f"requirements: {', '.join(iso.requirements)}")
    print(f"venv: {iso.venv or '(built at the first gym.make)'}")


def _where(kwargs: dict[str, Any]) -> str:
    """What ``list`` says an id plays: its source, server or task set, else what it needs."""
    from openenv_gym.registration import needs

    for key in ("source", "url", "tasks", "env_id", "env_key"):
        value = kwargs.get(key)
        if isinstance(value, str) and value:
            return value if key in ("source", "url", "tasks") else f"{key}={value}"
    what = needs(kwargs.get("adapter", ""))
    if what:
        return f"(gym.make needs {what})"
    return "(see `openenv-gym info ID` for its kwargs)"


def _cmd_list(args: argparse.Namespace) -> int:
    from openenv_gym.errors import CatalogError
    from openenv_gym.importers.catalog import read_catalog
    from openenv_gym.registration import env_id, env_info, list_environments

    # An imported source is a path on this machine: one deleted or moved since cannot be made,
    # and says so here rather than at the next gym.make. Lenient read: the invalid entries were
    # already named when the package imported.
    try:
        entries = read_catalog().entries
    except CatalogError:  # an unreadable file: the import said so; the ids are still listed
        entries = {}
    gone = {env_id(e.name): e.name for e in entries.values() if not os.path.exists(e.source)}
    for id in list_environments():
        line = f"{id:<32} {_where(env_info(id)['kwargs'])}"
        if id in gone:
            line += f"  [its source is gone: `openenv-gym remove {gone[id]}`]"
        print(line)
    return 0


def _imported(id: str) -> dict[str, Any] | None:
    """What the catalog recorded for ``id``: where it came from and, if isolated, its snapshot and venv."""
    from openenv_gym.importers.catalog import load_catalog
    from openenv_gym.registration import env_id

    entry = next((e for e in load_catalog().values() if env_id(e.name) == id), None)
    if entry is None:
        return None
    shown: dict[str, Any] = {"name": entry.name, "kind": entry.kind, "origin": entry.origin or entry.source,
                             "commit": entry.commit, "added_at": entry.added_at or None}
    if entry.isolated is not None:
        iso = entry.isolated
        shown.update(snapshot=entry.source, left_out_of_snapshot=list(iso.excluded),
                     requirements=list(iso.requirements), python=iso.python,
                     venv=iso.venv or "(built at the first gym.make)")
    if entry.options:
        shown["options"] = redact_kwargs(entry.options)
    return {k: redact_urls(v) if isinstance(v, str) else v for k, v in shown.items()}


def _cmd_info(args: argparse.Namespace) -> int:
    from openenv_gym.registration import env_info

    info = env_info(args.id)
    imported = _imported(info["id"])
    if imported is not None:
        info["imported"] = imported
    print(json.dumps(info, indent=2, default=str))
    return 0


def _cmd_remove(args: argparse.Namespace) -> int:
    from openenv_gym.importers.catalog import describe_invalid, remove_entry, remove_invalid

    if args.invalid == (args.name is not None):
        raise ConfigurationError("give a NAME or --invalid (every entry that cannot be registered)")
    if args.invalid:
        from openenv_gym.registration import ADAPTERS

        removed = remove_invalid(kinds=ADAPTERS)  # the entries `import openenv_gym` skips
        print(f"removed {len(removed)} invalid entries: {describe_invalid(removed)}" if removed
              else "no invalid entries")
        return 0
    entry = remove_entry(args.name)
    print(f"removed {args.name!r}" + (f" ({entry.source})" if entry is not None else " (an invalid entry)"))
    return 0


def _cmd_rollout(args: argparse.Namespace) -> int:
    from openenv_gym.processes import tune_gc
    from openenv_gym.registration import check_id
    from openenv_gym.rollout import collect
    from openenv_gym.web.play import parse_kwargs  # the one reader of KEY=VALUE env kwargs

    tune_gc()  # this process steps many sub-envs and nothing else

    check_id(args.id)
    make_kwargs = parse_kwargs(args.kwargs)
    if args.drop_equal and args.group_size is None:
        raise ConfigurationError("--drop-equal leaves out groups of equal rewards: it needs --group-size")
    if (args.append or args.overwrite) and not args.out:
        raise ConfigurationError("--append and --overwrite say what to do with the --out file: add --out")
    if_exists: Literal["error", "append", "overwrite"] = "append" if args.append else "overwrite" if args.overwrite else "error"
    policy: str | Policy = "random"
    if args.policy == "openai":
        from openenv_gym.policies import OpenAIPolicy

        if not args.base_url or not args.model:
            raise ConfigurationError("--policy openai needs --base-url and --model")
        policy = OpenAIPolicy(args.base_url, args.model)
    try:
        summary = collect(args.id, args.episodes, num_envs=args.num_envs, backend=args.backend, policy=policy,
                          seed=args.seed, batch_size=args.batch_size, out=args.out, progress=not args.quiet,
                          group_size=args.group_size, drop_equal=args.drop_equal, if_exists=if_exists,
                          make_kwargs=make_kwargs)
    finally:
        if not isinstance(policy, str):  # the OpenAI policy built above
            policy.close()
    print(summary.table())
    if args.out:
        verb = "appended to" if args.append else "written to"
        if summary.written:
            print(f"{summary.written} episodes {verb} {args.out}")
        elif summary.dropped_groups:
            print(f"no episodes {verb} {args.out}: every group's rewards were equal (--drop-equal left them out)")
        else:
            print(f"no episodes {verb} {args.out}")
    return 0


def _comma_list(text: str, what: str, convert: Any = str) -> list[Any]:
    try:
        items = [convert(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        items = []
    if not items:
        raise ConfigurationError(f"{what} must be a comma-separated list, e.g. 1,8,64; got {text!r}")
    return items


def _cmd_bench(args: argparse.Namespace) -> int:
    from openenv_gym.bench import BACKENDS, bench, plot, require_plotting, table
    from openenv_gym.registration import check_id

    # Everything that can fail is checked before the (long) run, not after it.
    check_id(args.id)
    sizes = _comma_list(args.num_envs, "--num-envs", int)
    backends = _comma_list(args.backend, "--backend")
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ConfigurationError(f"unknown backend {', '.join(map(repr, unknown))}; use {','.join(BACKENDS)}")
    if args.plot:
        require_plotting()
    rows = bench(args.id, sizes, backends, rounds=args.rounds, seed=args.seed)
    print(table(rows))
    if args.json:
        Path(args.json).write_bytes(msgspec.json.encode(rows))
        print(f"results written to {args.json}")
    if args.plot:
        plot(rows, args.plot, title=args.id)
        print(f"plot written to {args.plot}")
    return 0


def _cmd_view(args: argparse.Namespace) -> int:
    from openenv_gym.web.view import view_command

    return view_command(args.files, html=args.html, port=args.port)


def _cmd_play(args: argparse.Namespace) -> int:
    from openenv_gym.web.play import play_command

    make = None
    if args.seat is not None:  # one seat of a game; the other seats are the opponents' policy
        import gymnasium as gym

        if (args.opponent_url is None) != (args.opponent_model is None):
            raise ConfigurationError("--opponent-url and --opponent-model go together (an OpenAI-compatible "
                                     "endpoint and its model)")
        opponents: Any = ({"base_url": args.opponent_url, "model": args.opponent_model} if args.opponent_url
                          else "random")

        def make(env_id: str, **kwargs: Any) -> Any:
            return gym.make(env_id, single_player=args.seat, opponents=opponents, **kwargs)
    elif args.opponent_url is not None or args.opponent_model is not None:
        raise ConfigurationError("--opponent-url and --opponent-model play a game's other seats: give --seat")
    return play_command(args.id, args.kwargs, port=args.port, out=args.out, linger=args.linger, make=make)


def _cmd_serve(args: argparse.Namespace) -> int:
    from openenv_gym.serving.command import serve_command

    return serve_command(args)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` where there is a default to show (not for flags or an unset ``None``)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS:
            return action.help or ""
        return super()._get_help_string(action) or ""


def _kinds() -> str:
    from openenv_gym import backends  # the one place the importable kinds are listed

    return ", ".join(b.kind for b in backends.backends() if b.detect is not None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openenv-gym", description="Any LLM-agent environment as a Gymnasium env.",
                                     formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, formatter_class=_HelpFormatter)

    env_help = "an environment id, e.g. openenv/Arithmetic-v0 (see `openenv-gym list`)"

    p = command("import", "detect a source statically and add it to your catalog")
    p.add_argument("source", help="a file or folder holding the environment")
    p.add_argument("--name", required=True, help="registers openenv/NAME-v0 (ASCII letters, digits, _ - .)")
    p.add_argument("--kind", default=None, help=f"the source's kind, one of: {_kinds()} (detected if omitted)")
    p.add_argument("--env-class", default=None, help="the Environment class, when the source has several")
    p.add_argument("--isolated", action="store_true",
                   help="snapshot the source and build its own venv (uv): it plays in a host process under it")
    p.add_argument("--python", default=None, help="with --isolated: the venv's Python version, e.g. 3.12")
    p.add_argument("--no-build", action="store_true",
                   help="with --isolated: record the venv's requirements, build it at the first gym.make")
    p.add_argument("--include", action="append", default=None, metavar="PATH",
                   help="with --isolated: a " + "left-out path to copy into the snapshot anyway (a glob relative to the source, "
                        "e.g. .python-version; repeatable): dotfiles and credential-shaped names are left out by default")
    p.set_defaults(fn=_cmd_import)

    p = command("install", "fetch a source (git URL, folder or requirement), show it, ask, then import it isolated")
    p.add_argument("source", help="git+https://HOST/REPO[@REV][#subdirectory=PATH], git+file://..., a folder, "
                                  "or a requirement such as name==1.2")
    p.add_argument("--name", required=True, help="registers openenv/NAME-v0 (ASCII letters, digits, _ - .)")
    p.add_argument("--yes", action="store_true", help="consent in advance (scripts); without it, a terminal is asked")
    p.add_argument("--kind", default=None, help=f"the source's kind, one of: {_kinds()} (detected if omitted)")
    p.add_argument("--env-class", default=None, help="the Environment class, when the source has several")
    p.add_argument("--python", default=None, help="the venv's Python version, e.g. 3.12")
    p.add_argument("--no-build", action="store_true", help="record the venv's requirements, build it at the first gym.make")
    p.add_argument("--include", action="append", default=None, metavar="PATH",
                   help="a " + "left-out path to copy into the snapshot anyway (a glob relative to the source, "
                        "e.g. .python-version; repeatable): dotfiles and credential-shaped names are left out by default")
    p.set_defaults(fn=_cmd_install)

    p = command("list", "list the registered openenv ids and what each plays")
    p.set_defaults(fn=_cmd_list)

    p = command("info", "show what an id is: its entry point and kwargs (secrets hidden)")
    p.add_argument("id", help=env_help)
    p.set_defaults(fn=_cmd_info)

    p = command("remove", "remove an imported source from your catalog (a broken entry too)")
    p.add_argument("name", nargs="?", default=None, help="the NAME given to `openenv-gym import`")
    p.add_argument("--invalid", action="store_true", help="remove every entry that cannot be registered")
    p.set_defaults(fn=_cmd_remove)

    p = command("rollout", "collect episodes with a policy over a vector env")
    p.add_argument("id", help=env_help)
    p.add_argument("kwargs", nargs="*", metavar="KEY=VALUE",
                   help="env kwargs for gym.make (as for play and serve); a VALUE that parses as JSON is that value, else a string")
    p.add_argument("--episodes", type=int, default=100, help="episodes to collect")
    p.add_argument("--num-envs", type=int, default=8, help="sub-envs stepped at once")
    p.add_argument("--backend", choices=("concurrent", "ray"), default="concurrent", help="vector env backend")
    p.add_argument("--batch-size", type=int, default=None, help="first-ready batch size (default: num_envs/4)")
    p.add_argument("--policy", choices=("random", "openai"), default="random",
                   help="random tool calls, or a model behind an OpenAI-compatible server")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", default=None, help="model name for --policy openai")
    p.add_argument("--seed", type=int, default=0, help="seed of task choice and the random policy")
    p.add_argument("--out", default=None,
                   help="write episodes as JSONL to this file (one that holds data is refused without --append or --overwrite)")
    exists = p.add_mutually_exclusive_group()
    exists.add_argument("--append", action="store_true", help="with --out: add to the file's records")
    exists.add_argument("--overwrite", action="store_true", help="with --out: replace the file")
    p.add_argument("--group-size", type=int, default=None,
                   help="episodes per task (GRPO/RLOO groups): records get group-normalised advantages")
    p.add_argument("--drop-equal", action="store_true", help="with --group-size, leave out groups of equal rewards")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=_cmd_rollout)

    p = command("bench", "env-steps/sec over num_envs x backends, Gymnasium's vectorizers included")
    p.add_argument("id", help=env_help)
    p.add_argument("--num-envs", default="1,8,64", help="comma-separated sub-env counts")
    p.add_argument("--backend", default="concurrent,sync,async", help="comma-separated: concurrent,ray,sync,async")
    p.add_argument("--rounds", type=int, default=20, help="lockstep steps per configuration")
    p.add_argument("--seed", type=int, default=0, help="seed of resets and the random policy")
    p.add_argument("--json", default=None, help="write the rows as JSON to this file")
    p.add_argument("--plot", default=None, help="write a PNG plot to this file (needs matplotlib)")
    p.set_defaults(fn=_cmd_bench)

    p = command("view", "show rollout and RecordEpisodes files in a page (served on 127.0.0.1, or --html)")
    p.add_argument("files", nargs="+", metavar="FILE", help="JSONL episode files (rotated FILE.1 ... are read too)")
    p.add_argument("--html", default=None, metavar="OUT", help="write one self-contained page to OUT instead of serving")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    p.set_defaults(fn=_cmd_view)

    p = command("play", "play an env by hand in a page served on 127.0.0.1")
    p.add_argument("id", help=env_help)
    p.add_argument("kwargs", nargs="*", metavar="KEY=VALUE",
                   help="env kwargs for gym.make; a VALUE that parses as JSON is that value, else a string")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    p.add_argument("--out", default="play.jsonl", help="where the page's Save button appends the episode's record")
    p.add_argument("--linger", type=float, default=30.0,
                   help="seconds the server waits for a page to come back after the last one closed, then stops")
    p.add_argument("--seat", help="a multi-agent env: the seat you take (player1); the others play --opponent-url's "
                                  "model, else random text")
    p.add_argument("--opponent-url", help="an OpenAI-compatible endpoint (http://127.0.0.1:8000/v1) for the other seats")
    p.add_argument("--opponent-model", help="the model name to ask --opponent-url for")
    p.set_defaults(fn=_cmd_play)

    p = command("serve", "serve an env to other ecosystems' clients, over ORS or OpenEnv's protocol")
    p.add_argument("id", help=env_help)
    from openenv_gym.serving.command import add_arguments

    add_arguments(p)
    p.set_defaults(fn=_cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        if args.command in ("list", "info", "rollout", "bench", "play", "serve"):
            import openenv_gym  # noqa: F401  (registers the ids these commands look up)
        return args.fn(args)
    except OpenEnvGymError as exc:
        print(f"openenv-gym: error: {redact_urls(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("openenv-gym: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`openenv-gym list | head -1`): end quietly, as other CLIs do, and
        # point stdout at /dev/null so the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
