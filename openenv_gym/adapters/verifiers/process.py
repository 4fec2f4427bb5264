"""What the Verifiers adapters change in this process, owned in one place and put back.

Playing a Verifiers environment needs a few things that are process-wide by nature:

* a ``source=`` must be importable by name (the library's loaders ``import_module`` it), so its
  folder goes on ``sys.path`` and its modules into ``sys.modules``; v1 tool servers are spawned
  as ``python -m <module>`` by the library, so the folder also goes on ``PYTHONPATH``;
* a v1 harness runs under ``uv``; when ``uv`` sits only next to ``sys.executable`` (a venv's
  ``bin``), that folder goes on ``PATH``;
* a legacy (v0) ``Environment`` installs SIGINT/SIGTERM handlers and an ``atexit`` teardown
  when it is built (``Environment.__post_init__``).

:data:`STATE` (one per process) owns the first two: every change is counted per adapter that
needs it and undone when the last of them closes (:meth:`ProcessState.acquire` /
:meth:`ProcessState.release`, or :func:`importable` as a context manager), so after ``close()``
``sys.path``, ``sys.modules``, ``PYTHONPATH`` and ``PATH`` are as they were, and a later
``env_id=`` lookup finds only what is really installed. :func:`building_v0_env` scopes the third:
while a v0 env is built, the library's module sees ``signal``/``atexit`` stand-ins that record,
for the building thread only, what it would install; no handler of the process changes, and the
env's teardown is registered with ``atexit`` only until its adapter closes.

One more thing outlives the library's own launches: each v1 tool server it starts writes its port
to ``/tmp/vf-port-<hex>`` (``MCP_PORT_FILE``), which nothing removes. :data:`PORT_FILES` notes
the port files of the tool servers this process started (read from their environment in
``/proc``) and removes each once its server has exited.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from openenv_gym.processes import alive, descendants

__all__ = ["PORT_FILES", "STATE", "PortFiles", "ProcessState", "V0Construction", "building_v0_env", "importable"]


def _under(path: str | None, root: Path) -> bool:
    if not path:
        return False
    try:
        return Path(path).resolve().is_relative_to(root)
    except (OSError, ValueError):
        return False


def _module_paths(module: ModuleType) -> list[str]:
    """Where a module's code is: its file, else (a namespace package) its search locations."""
    file = getattr(module, "__file__", None)
    if file:
        return [file]
    return [str(p) for p in (getattr(module, "__path__", None) or ())]


@dataclass
class _Root:
    """One import root and what acquiring it changed."""

    count: int = 0
    on_sys_path: bool = False  # we put it on sys.path
    modules_before: dict[str, ModuleType] = field(default_factory=dict)


@dataclass
class _Entry:
    """One entry of a path-list environment variable (``PYTHONPATH``, ``PATH``) we put first."""

    count: int = 0
    added: bool = False
    was_set: bool = True


class ProcessState:
    """The process-wide changes the Verifiers adapters make, counted and put back (one per process)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: a finalizer may release from inside a GC pass
        self._roots: dict[Path, _Root] = {}
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._ever: set[Path] = set()  # every root acquired once (their modules are ours to drop)

    # -- import roots -----------------------------------------------------------------------------
    def acquire(self, root: str | os.PathLike[str], *, pythonpath: bool = False) -> Path:
        """Make modules under ``root`` importable by name (and, with ``pythonpath``, in child
        processes) until the matching :meth:`release`; returns the resolved root."""
        path = Path(root).resolve()
        with self._lock:
            state = self._roots.setdefault(path, _Root())
            if state.count == 0:
                state.modules_before = dict(sys.modules)
                if str(path) not in sys.path:
                    sys.path.insert(0, str(path))
                    state.on_sys_path = True
            state.count += 1
            self._ever.add(path)
            if pythonpath:
                self.acquire_entry("PYTHONPATH", str(path))
        return path

    def release(self, root: str | os.PathLike[str], *, pythonpath: bool = False) -> None:
        """Undo one :meth:`acquire`; the last one takes ``root`` off ``sys.path`` and drops the
        modules imported from it (a module it shadowed comes back)."""
        path = Path(root).resolve()
        with self._lock:
            if pythonpath:
                self.release_entry("PYTHONPATH", str(path))
            state = self._roots.get(path)
            if state is None or state.count == 0:
                return
            state.count -= 1
            if state.count:
                return
            del self._roots[path]
            if state.on_sys_path:
                with contextlib.suppress(ValueError):
                    sys.path.remove(str(path))
                sys.path_importer_cache.pop(str(path), None)
            before = state.modules_before
            for name, module in list(sys.modules.items()):
                if module is None or before.get(name) is module:
                    continue
                if not any(_under(p, path) for p in _module_paths(module)):
                    continue
                previous = before.get(name)
                if previous is not None and self._live(previous):
                    sys.modules[name] = previous
                else:
                    sys.modules.pop(name, None)

    def _live(self, module: ModuleType) -> bool:
        """Whether ``module`` may stay importable: not from a root whose last holder released it."""
        paths = _module_paths(module)
        return not any(_under(p, root) for p in paths for root in self._ever - set(self._roots))

    # -- path-list environment variables ----------------------------------------------------------
    def acquire_entry(self, var: str, entry: str) -> None:
        """Put ``entry`` first in the path list ``$var`` (unless there) until :meth:`release_entry`."""
        with self._lock:
            state = self._entries.setdefault((var, entry), _Entry())
            if state.count == 0:
                current = os.environ.get(var)
                state.was_set = current is not None
                parts = [p for p in (current or "").split(os.pathsep) if p]
                state.added = entry not in parts
                if state.added:
                    os.environ[var] = os.pathsep.join([entry, *parts])
            state.count += 1

    def release_entry(self, var: str, entry: str) -> None:
        """Undo one :meth:`acquire_entry`; the last one takes ``entry`` out of ``$var`` again."""
        with self._lock:
            state = self._entries.get((var, entry))
            if state is None:
                return
            state.count -= 1
            if state.count:
                return
            del self._entries[(var, entry)]
            if not state.added or var not in os.environ:
                return
            parts = os.environ[var].split(os.pathsep)
            if entry in parts:
                parts.remove(entry)
            if parts or state.was_set:
                os.environ[var] = os.pathsep.join(parts)
            else:
                del os.environ[var]


STATE = ProcessState()
"""The one owner of the Verifiers adapters' process-wide changes."""


@contextlib.contextmanager
def importable(root: str | os.PathLike[str], *, pythonpath: bool = True) -> Iterator[Path]:
    """Modules under ``root`` importable by name (and by child processes) for the ``with`` block."""
    path = STATE.acquire(root, pythonpath=pythonpath)
    try:
        yield path
    finally:
        STATE.release(path, pythonpath=pythonpath)


# -- the library's port files -----------------------------------------------------------------------

class PortFiles:
    """The ``MCP_PORT_FILE`` files of tool servers this process launched, removed once their server
    has exited (the library reads each once, right after the server writes it, and never removes it).

    Linux (``/proc``); elsewhere nothing is noted. Only files named in the environment of this
    process's own descendants are touched, so another process's launches are never disturbed.
    """

    VARIABLE = b"MCP_PORT_FILE="

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, int] = {}  # port file -> the pid of the server that writes it

    def note(self) -> None:
        """Note the port files of the tool servers now running under this process."""
        found = {}
        for pid in descendants(os.getpid()):
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    environ = fh.read().split(b"\0")
            except OSError:
                continue
            for item in environ:
                if item.startswith(self.VARIABLE):
                    found[os.fsdecode(item[len(self.VARIABLE):])] = pid
        with self._lock:
            self._files.update(found)

    def sweep(self) -> list[str]:
        """Remove the noted files whose server has exited; the files removed."""
        with self._lock:
            gone = [f for f, pid in self._files.items() if not alive(pid)]
            for f in gone:
                del self._files[f]
        for f in gone:
            with contextlib.suppress(OSError):
                os.unlink(f)
        return gone


PORT_FILES = PortFiles()
"""The port files of the library's tool servers launched by this process."""


# -- building a legacy (v0) environment -----------------------------------------------------------

@dataclass
class V0Construction:
    """What a v0 env's construction asked of the process: the handlers and exit hooks it would
    have installed (recorded, never installed)."""

    handlers: list[tuple[int, Any]] = field(default_factory=list)
    exit_hooks: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    _registered: list[Callable[..., Any]] = field(default_factory=list)

    def register_exit_hooks(self) -> None:
        """Register the env's exit hooks with ``atexit`` (the library wants its teardown at exit)."""
        for fn, args, kwargs in self.exit_hooks:
            hook = fn if not (args or kwargs) else _bound(fn, args, kwargs)
            atexit.register(hook)
            self._registered.append(hook)

    def unregister_exit_hooks(self) -> None:
        """Take them back (the adapter closed and tore the env down itself)."""
        while self._registered:
            atexit.unregister(self._registered.pop())


def _bound(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    def hook() -> Any:
        return fn(*args, **kwargs)
    return hook


class _Recorder:
    """Stands in for ``signal`` or ``atexit`` in the library's module while envs are built: calls
    from a thread that is building one are recorded on its :class:`V0Construction`; every other
    call goes to the real module."""

    def __init__(self, real: ModuleType, builds: dict[int, V0Construction]):
        self._real = real
        self._builds = builds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def signal(self, signalnum: int, handler: Any) -> Any:
        build = self._builds.get(threading.get_ident())
        if build is None:
            return self._real.signal(signalnum, handler)
        build.handlers.append((signalnum, handler))
        return signal.getsignal(signalnum)

    def register(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        build = self._builds.get(threading.get_ident())
        if build is None:
            return self._real.register(func, *args, **kwargs)
        build.exit_hooks.append((func, args, kwargs))
        return func


_build_lock = threading.Lock()
_builds: dict[int, V0Construction] = {}
_patched: dict[str, Any] = {}


@contextlib.contextmanager
def building_v0_env(library_module: ModuleType | None) -> Iterator[V0Construction]:
    """Build a v0 env in the ``with`` block without it touching the process's signal handlers or
    ``atexit`` hooks, from any thread.

    ``library_module`` is the module defining the library's ``Environment`` (whose
    ``__post_init__`` calls ``signal.signal`` and ``atexit.register``): for the duration, and for
    the building thread only, its ``signal`` and ``atexit`` names record those calls instead
    (off the main thread ``signal.signal`` would raise; in it, it would replace the process's
    SIGINT/SIGTERM handlers). Nothing outside that module sees a change, and it is put back when
    the last concurrent build ends. verifiers' legacy API is frozen (0.3.1 is its last release),
    so the module's layout cannot drift; a module without those names is left alone.
    """
    ident = threading.get_ident()
    with _build_lock:
        outer = _builds.get(ident)
        if outer is not None:  # a build inside a build on this thread: the outer one records
            build = outer
        else:
            build = _builds[ident] = V0Construction()
            if len(_builds) == 1 and library_module is not None:
                for name, real in (("signal", signal), ("atexit", atexit)):
                    if getattr(library_module, name, None) is real:
                        _patched[name] = real
                        setattr(library_module, name, _Recorder(real, _builds))
    try:
        yield build
    finally:
        if outer is None:
            with _build_lock:
                _builds.pop(ident, None)
                if not _builds and library_module is not None:
                    for name, real in _patched.items():
                        setattr(library_module, name, real)
                    _patched.clear()
