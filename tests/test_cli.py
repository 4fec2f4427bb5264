"""The ``openenv-gym`` command as a new user meets it: help, mistakes, Ctrl-C.

Mistakes print one line and exit 2 before anything runs; Ctrl-C prints one line and exits 130.
Commands run in-process through ``main([...])`` where they finish quickly, and in a real
subprocess where a signal has to arrive mid-run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import openenv_gym
from openenv_gym.cli import build_parser, main
from openenv_gym.importers import DETECTORS
from openenv_gym.serving.server import Server
from openenv_gym.testing import procs


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", ["rollout", "bench"])
def test_an_unknown_id_is_one_line_with_close_matches(command, capsys):
    assert main([command, "openenv/Arithmetc-v0"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    # other tests in the same process may have registered more close matches (openenv/VfArith-v0)
    assert lines[0].startswith("openenv-gym: error: 'openenv/Arithmetc-v0' is not registered; "
                               "did you mean openenv/Arithmetic-v0"), err
    assert out == ""


@pytest.mark.parametrize("name", list(subcommands()))
def test_every_argument_has_help(name):
    parser = subcommands()[name]
    missing = [a.dest for a in parser._actions if not isinstance(a, argparse._HelpAction) and not a.help]
    assert missing == []


def test_help_shows_defaults():
    text = subcommands()["rollout"].format_help()
    for shown in ("(default: 100)", "(default: 8)", "(default: concurrent)", "(default: random)", "(default: 0)"):
        assert shown in text
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "(default: 1,8,64)" in subcommands()["bench"].format_help()


def test_import_help_lists_every_importable_kind():
    text = " ".join(subcommands()["import"].format_help().split())
    assert f"one of: {', '.join(DETECTORS)}" in text and "verifiers" in text


def test_list_says_what_an_id_without_a_source_needs(capsys):
    assert main(["list"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "url= or source=" not in lines["openenv/Fleet-v0"]
    assert "env_key=" in lines["openenv/Fleet-v0"] and "api_key=" in lines["openenv/Fleet-v0"]
    assert "url=" in lines["openenv/ORS-v0"] and "source=" in lines["openenv/ORS-v0"]
    assert "env_id=" in lines["openenv/Verifiers-v0"]
    assert lines["openenv/Arithmetic-v0"].endswith("arithmetic.py")


def test_bench_plot_without_matplotlib_fails_before_running(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    plot = tmp_path / "plot.png"
    assert main(["bench", "openenv/Arithmetic-v0", "--num-envs", "1", "--backend", "concurrent",
                 "--plot", str(plot)]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no table: the benchmark never ran
    assert "pip install 'openenv-gym[bench]'" in err and len(err.strip().splitlines()) == 1
    assert not plot.exists()


@pytest.mark.parametrize("args, message", [
    (["bench", "openenv/Arithmetic-v0", "--num-envs", "a,b"], "--num-envs"),
    (["bench", "openenv/Arithmetic-v0", "--backend", "concurent"], "concurent"),
    (["remove"], "--invalid"),
    (["remove", "x", "--invalid"], "--invalid"),
])
def test_other_mistakes_are_one_line_too(args, message, capsys, private_catalog):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("openenv-gym: error:") and message in err and len(err.strip().splitlines()) == 1


def _children(pid: int) -> list[int]:
    """Child processes of ``pid``, started from any of its threads (servers start off the main one)."""
    return procs.children(pid)


_alive = procs.alive


@pytest.mark.parametrize("args", [
    ["rollout", "openenv/Arithmetic-v0", "--episodes", "1000000", "--num-envs", "2", "--quiet"],
    ["bench", "openenv/Arithmetic-v0", "--num-envs", "2", "--backend", "concurrent", "--rounds", "10000000"],
])
def test_ctrl_c_prints_one_line_and_exits_130(args, private_catalog):
    proc = subprocess.Popen([sys.executable, "-m", "openenv_gym.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        deadline = time.monotonic() + 60
        while not _children(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # wait until the environment's server is up: the run is under way
        servers = _children(proc.pid)
        assert servers, proc.stderr.read() if proc.poll() is not None else "no server started"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["openenv-gym: interrupted"]
    deadline = time.monotonic() + 10
    while any(map(_alive, servers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, servers))  # and the server went with it


ARITHMETIC_SOURCE = Path(openenv_gym.__file__).parent / "examples" / "arithmetic.py"


def _raise_interrupt(*args, **kwargs):
    raise KeyboardInterrupt


# Where each command is interrupted, and the arguments that get it there: a call deep in its
# work. The catalog writers are interrupted at the fsync of the new catalog (written to a temp
# file beside it, not yet renamed over it); the commands that start servers, after they started.
INTERRUPTS: dict[str, tuple[list[str], tuple[object, str]]] = {
    "import": (["import", "SOURCE", "--name", "Interrupted"], (os, "fsync")),
    "install": (["install", "SOURCE", "--name", "Interrupted", "--yes", "--no-build"], (os, "fsync")),
    "list": (["list"], ("openenv_gym.registration", "list_environments")),
    "info": (["info", "openenv/Arithmetic-v0"], ("openenv_gym.registration", "env_info")),
    "remove": (["remove", "Kept"], (os, "fsync")),
    "rollout": (["rollout", "openenv/Arithmetic-v0", "--episodes", "4", "--num-envs", "2", "--quiet"],
                ("openenv_gym.rollout", "run")),
    "bench": (["bench", "openenv/Arithmetic-v0", "--num-envs", "2", "--backend", "concurrent", "--rounds", "1"],
              ("openenv_gym.bench", "RandomPolicy")),
    # The page and serving commands stop on Ctrl-C once they serve (exit 0, "stopped": their own
    # tests); here Ctrl-C lands while they start, after the env or its sessions are up.
    "view": (["view", "RECORDS"], ("openenv_gym.web.view", "run")),
    "play": (["play", "openenv/Arithmetic-v0", "--out", "played.jsonl"], ("openenv_gym.web.play", "run")),
    "serve": (["serve", "openenv/Arithmetic-v0", "--max-sessions", "2"], (Server, "_astart")),
}


@pytest.mark.parametrize("command", list(subcommands()))
def test_an_interrupt_in_any_command_is_one_line_and_leaves_nothing_half_done(
        command, monkeypatch, capsys, private_catalog, tmp_path):
    """Every command the parser knows (a new one fails here until it has a case): Ctrl-C deep in
    its work prints one line, exits 130, leaves the catalog as it was (no temp file beside it) and
    leaves no server running."""
    assert command in INTERRUPTS, f"add an interrupt case for `openenv-gym {command}` to INTERRUPTS"
    argv, (where, name) = INTERRUPTS[command]
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(ARITHMETIC_SOURCE, source / "arithmetic.py")
    monkeypatch.setenv("OPENENV_GYM_DATA", str(tmp_path / "data"))
    assert main(["import", str(source / "arithmetic.py"), "--name", "Kept"]) == 0  # a catalog to keep
    capsys.readouterr()
    catalog = private_catalog.read_bytes()
    children = set(procs.children(os.getpid()))
    monkeypatch.setattr(importlib.import_module(where) if isinstance(where, str) else where, name, _raise_interrupt)
    records = tmp_path / "episodes.jsonl"
    records.write_text("{\"env\": \"openenv/Kept-v0\", \"messages\": []}\n")  # one episode for `view` to show
    monkeypatch.chdir(tmp_path)  # where `play` writes its episodes
    code = main([{"SOURCE": str(source), "RECORDS": str(records)}.get(a, a) for a in argv])
    monkeypatch.undo()
    assert (code, capsys.readouterr().err) == (130, "openenv-gym: interrupted\n")
    assert private_catalog.read_bytes() == catalog
    assert sorted(p.name for p in private_catalog.parent.iterdir()) == sorted(
        [private_catalog.name, *[p.name for p in private_catalog.parent.iterdir() if p.suffix == ".lock"]])
    deadline = time.monotonic() + 10
    while set(procs.children(os.getpid())) - children and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(procs.children(os.getpid())) - children, "a server outlived the interrupted command"
