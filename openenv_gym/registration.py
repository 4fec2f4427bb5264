"""Gymnasium registration of every environment openenv_gym knows, and the one entry point that builds them.

Gymnasium 1.x loads no plugins, so ``import openenv_gym`` registers everything here, from four
places:

1. built-ins: ``openenv/ORS-v0`` (any ORS server or source, by kwargs), ``openenv/Fleet-v0`` (any
   Fleet environment or task set, by kwargs), ``openenv/Verifiers-v0`` and the bundled examples;
2. installed Verifiers environment packages (distributions that depend on ``verifiers``) and
   installed OpenEnv environment packages (``openenv/<name>-v0``, read from metadata and manifests);
3. installed packages exposing the entry-point group ``openenv_gym.envs``: each entry point is a
   callable returning an iterable of dicts with ``id``, ``adapter`` (``"module:Class"``) and
   optional ``kwargs`` (or, for any other env, ``entry_point`` instead of ``adapter``);
4. the user's catalog of imported sources (``openenv-gym import``), last, so that a name the user
   chose wins over a discovered one. A bad catalog entry is skipped with one warning naming every
   bad entry; the rest register.

**One entry point.** Every id is built by :func:`make_env` (``gym.make``) and :func:`make_vec`
(``gym.make_vec``) from the ``adapter`` its spec's kwargs name: an
:class:`~openenv_gym.adapters.base.Adapter` class, or a front door returning the
:class:`~openenv_gym.adapters.base.AdapterSpec` to build (Verifiers picks its generation so).
Adapters know nothing of envs or vector envs. Both entry points check every kwarg name against
the adapter's constructor and the env's own keys *before* anything is built, and refuse unknown
ones with :class:`~openenv_gym.errors.ConfigurationError` (a ``ValueError``) naming them, never
their values: a ``TypeError`` from an entry point is re-raised by Gymnasium with every kwarg
printed, secrets included.

Every id lives in the ``openenv`` namespace, is registered ``nondeterministic=True`` (a remote
backend may answer differently for the same seed) and with ``order_enforce=False``: AgentEnv
enforces reset-before-step itself with :mod:`openenv_gym.errors` exceptions.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from gymnasium.envs.registration import get_env_id

from openenv_gym import backends
from openenv_gym.errors import CatalogError, ConfigurationError
from openenv_gym.redact import RedactedEnvSpec, redact_kwargs
from openenv_gym.session import check_env_values

if TYPE_CHECKING:
    from openenv_gym.adapters.base import AdapterSpec
    from openenv_gym.env import AgentEnv
    from openenv_gym.hosts.interpreter import Interpreter
    from openenv_gym.vector import AgentVectorEnv

__all__ = [
    "NAMESPACE", "ADAPTERS", "needs", "ENTRY_POINT", "VECTOR_ENTRY_POINT", "ENV_KWARGS", "VECTOR_KWARGS", "EXPECTED_SESSIONS",
    "make_env", "make_vec", "check_make_kwargs", "adapter_spec", "register_all", "list_environments", "env_info", "env_id", "check_id",
]

NAMESPACE = "openenv"
ENTRY_POINT_GROUP = "openenv_gym.envs"
_EXAMPLES = Path(__file__).parent / "examples"

ENTRY_POINT = "openenv_gym.registration:make_env"
VECTOR_ENTRY_POINT = "openenv_gym.registration:make_vec"

class _Adapters(Mapping[str, str]):
    """Kind of a catalog entry -> the adapter that plays it (``"module:Class"`` or a front door),
    read from the backends' descriptors (:mod:`openenv_gym.backends`) when asked."""

    def __getitem__(self, kind: str) -> str:
        backend = backends.get(kind)
        if backend is None:
            raise KeyError(kind)
        return backend.adapter

    def __iter__(self) -> Iterator[str]:
        return iter([b.kind for b in backends.backends()])

    def __len__(self) -> int:
        return len(backends.backends())


ADAPTERS: Mapping[str, str] = _Adapters()


def needs(adapter: str) -> str | None:
    """What an id of ``adapter`` needs from ``gym.make`` when its spec holds no source (for ``list``)."""
    return next((b.needs for b in backends.backends() if b.adapter == adapter), None)


ENV_KWARGS = ("split", "max_turns", "render_mode", "step_timeout", "start_timeout")
SEAT_ADAPTER = "openenv_gym.multiagent.seat:SeatAdapter"
"""The adapter ``gym.make(ID, single_player=SEAT, opponents=...)`` builds: one seat of a game, the
others played by ``opponents`` (``openenv_gym.multiagent``, a floor above: reached by name)."""
"""Kwargs of the env rather than the adapter (unless the adapter takes the name itself)."""

HOST_KWARGS = ("python", "isolate")
"""Kwargs that run the adapter in a host process under another interpreter (:mod:`openenv_gym.hosts`):
``python=PATH``, or ``isolate=True`` (or a Python version such as ``"3.12"``) for the env's own
venv, built by :mod:`openenv_gym.isolation.venvs` from its source's requirements. An isolated
catalog entry registers ``isolate=``; a ``python=`` given to ``gym.make`` wins over it, and
``isolate=False`` plays it in this process."""

VECTOR_KWARGS = ("backend", "vector_options", "autoreset_mode", "max_episode_steps", "group_size", "env_wrappers")
"""Kwargs :func:`make_vec` takes besides :data:`ENV_KWARGS` and the adapter's."""

EXPECTED_SESSIONS = "expected_sessions"
"""Constructor parameter through which :func:`make_vec` tells an adapter how many sub-envs will
run at once (its ``num_envs``), so that a server it launches allows that many sessions. Only an
adapter whose constructor names it receives it; a value the caller passed wins."""

# Entry points of earlier releases, which plugins may still name: the adapter each one built.
_LEGACY_ENTRY_POINTS = {
    "openenv_gym.adapters.ors:make_env": ADAPTERS["ors"],
    "openenv_gym.adapters.fleet:make_env": ADAPTERS["fleet"],
    "openenv_gym.adapters.verifiers:make_env": ADAPTERS["verifiers"],
}


def env_id(name: str) -> str:
    """The Gymnasium id of an openenv_gym environment called ``name``.

    >>> env_id("Gsm8kTools")
    'openenv/Gsm8kTools-v0'
    """
    return f"{NAMESPACE}/{name}-v0"


# -- the entry points ----------------------------------------------------------------------------

def _adapter_and_env_kwargs(adapter: str | None, kwargs: dict[str, Any],
                            also: tuple[str, ...] = ()) -> tuple[AdapterSpec, dict[str, Any]]:
    """Split ``gym.make`` kwargs into the adapter's spec and the env's kwargs; refuse unknown names.

    Nothing is built or started: a front door only picks the class. An env key the adapter's
    constructor names itself goes to the adapter (Verifiers' ``max_turns`` is the library's own
    turn limit, so a cut-off episode is still scored).
    """
    if not adapter:
        raise ConfigurationError(
            "this id names no adapter: register it with kwargs={'adapter': 'module:Class', ...}")
    if "startup_timeout" in kwargs:  # the adapters' own name of the wait, once the user's too
        warnings.warn("startup_timeout is start_timeout's old name: pass start_timeout (seconds the env may take to "
                      "start, its local servers included)", DeprecationWarning, stacklevel=4)
        kwargs.setdefault("start_timeout", kwargs.pop("startup_timeout"))
        kwargs.pop("startup_timeout", None)
    check_env_values(kwargs)
    env_kwargs = {k: kwargs.pop(k) for k in ENV_KWARGS if k in kwargs}
    host = {k: kwargs.pop(k) for k in HOST_KWARGS if k in kwargs}
    from openenv_gym.adapters.base import (  # the adapter layer, on first make
        AdapterSpec,
        accepted_kwargs,
    )

    spec = AdapterSpec(adapter, kwargs).resolve()
    try:
        accepted = accepted_kwargs(spec.target())
    except ImportError:
        if not host:
            raise
        accepted = None  # the adapter needs packages only its host's interpreter has: it checks there
    if accepted is not None:
        for key in [k for k in env_kwargs if k in accepted]:
            spec.kwargs[key] = env_kwargs.pop(key)
        if "start_timeout" in env_kwargs and "startup_timeout" in accepted:  # one name bounds the wait for a server too
            spec.kwargs["startup_timeout"] = env_kwargs["start_timeout"]
        spec.check(also=(*ENV_KWARGS, *HOST_KWARGS, *also))
    python = _host_python(spec, **host)
    if python is not None:
        env_kwargs["python"] = python
    return spec, env_kwargs


def check_make_kwargs(id: str, kwargs: dict[str, Any], *, vector: bool = False) -> None:
    """Refuse, as ``gym.make(id, **kwargs)`` (or ``gym.make_vec``) would, any kwarg ``id`` cannot
    take, before anything is built: for a caller that builds later (a session pool, a TRL spec)."""
    adapter_spec(id, kwargs, vector=vector)


def adapter_spec(id: str, kwargs: dict[str, Any], *, vector: bool = False) -> tuple[AdapterSpec, dict[str, Any]]:
    """What ``gym.make(id, **kwargs)`` would build: the adapter's spec and the env's kwargs
    (checked as ``gym.make`` checks them; nothing is built), for a caller that builds the adapter
    itself (:mod:`openenv_gym.multiagent`)."""
    spec = gym.spec(check_id(id))
    given = {**(spec.kwargs or {}), **kwargs}
    return _adapter_and_env_kwargs(given.pop("adapter", None), given, also=VECTOR_KWARGS if vector else ())


def _host_python(spec: AdapterSpec, python: Any = None, isolate: Any = None) -> Interpreter | None:
    """The interpreter a host process runs the adapter under (``None``: in this process)."""
    from openenv_gym.hosts.interpreter import Interpreter

    if python is not None:  # an interpreter named by the caller wins over the id's own isolate=
        if not isinstance(python, (str, Path)) or not str(python):
            raise ConfigurationError(f"python= must be the path of an interpreter, not {type(python).__name__}")
        return Interpreter(path=str(python))
    if isolate in (None, False):
        return None
    if isolate is not True and not isinstance(isolate, str):
        raise ConfigurationError("isolate= must be True or a Python version such as '3.12'")
    kind = backends.kind_of_adapter(spec.entry)
    if kind is None:
        raise ConfigurationError(f"isolate=True does not know which SDK {spec.entry} needs; pass python= instead")
    source = spec.kwargs.get("source")
    return Interpreter(kind=kind, source=None if source is None else str(source), sdk=spec.kwargs.get("sdk"),
                       version=None if isolate is True else isolate)


def _seat(kwargs: dict[str, Any]) -> tuple[Any, Any] | None:
    """``(single_player, opponents)`` taken out of ``kwargs``, or ``None`` for a single-agent make."""
    seat, opponents = kwargs.pop("single_player", None), kwargs.pop("opponents", None)
    if seat is None and opponents is not None:
        raise ConfigurationError("opponents= plays the other seats of a game: pass single_player=SEAT too")
    if seat is not None and not isinstance(seat, str):
        raise ConfigurationError(f"single_player= names a seat (a string such as 'player1'), not {type(seat).__name__}")
    return None if seat is None else (seat, opponents)


def _seat_spec(game: AdapterSpec, seat: str, opponents: Any) -> AdapterSpec:
    """The adapter of one seat of ``game`` (:data:`SEAT_ADAPTER`), the others played by ``opponents``."""
    from openenv_gym.adapters.base import AdapterSpec

    return AdapterSpec(SEAT_ADAPTER, {"game": {"entry": game.entry, "kwargs": dict(game.kwargs)}, "seat": seat,
                                      "opponents": opponents})


def make_env(adapter: str | None = None, **kwargs: Any) -> AgentEnv:
    """Gymnasium entry point of every openenv id: an :class:`~openenv_gym.env.AgentEnv` over ``adapter``.

    ``kwargs`` are the adapter's constructor kwargs plus the env's :data:`ENV_KWARGS` (``split``,
    ``max_turns``, ``render_mode``, ``step_timeout``, ``start_timeout``); for a game,
    ``single_player=SEAT`` and ``opponents=`` make one seat the env
    (:class:`~openenv_gym.multiagent.SinglePlayer`). An unknown name is a
    :class:`~openenv_gym.errors.ConfigurationError` naming it, with close matches, before
    anything is built.
    """
    seat = _seat(kwargs)
    spec, env_kwargs = _adapter_and_env_kwargs(adapter, kwargs)
    if seat is not None:
        spec = _seat_spec(spec, *seat)
    from openenv_gym.env import AgentEnv

    python = env_kwargs.pop("python", None)
    try:
        if python is not None:
            from openenv_gym.hosts.runner import HostRunner

            runner = HostRunner(python.resolve(), spec, split=env_kwargs.get("split"),
                                max_turns=env_kwargs.pop("max_turns", None))
            return AgentEnv(None, runner=runner, **env_kwargs)
        return AgentEnv(spec.build(), **env_kwargs)
    except TypeError as exc:
        # Gymnasium would re-raise a TypeError with every kwarg in its message, secrets included.
        raise ConfigurationError(f"the environment could not be built: TypeError: {exc}") from exc


def make_vec(
    num_envs: int = 1,
    *,
    adapter: str | None = None,
    backend: str = "concurrent",
    vector_options: dict[str, Any] | None = None,
    autoreset_mode: Any = None,
    max_episode_steps: int | None = None,
    group_size: int | None = None,
    env_wrappers: Any = None,
    **kwargs: Any,
) -> AgentVectorEnv:
    """Gymnasium vector entry point of every openenv id: ``gym.make_vec(id, num_envs, backend=...)``.

    ``kwargs`` are :func:`make_env`'s; ``split`` and ``max_turns`` apply to each sub-env,
    ``max_episode_steps`` caps ``max_turns``; ``vector_options`` go to the backend's class
    (``envs_per_client``, ``max_in_flight``, ``num_actors``, ``address``, ``runtime_env``...).
    ``group_size=k`` makes groups of ``k`` sub-envs whose ``e``-th episodes share a task (GRPO,
    RLOO, pass@k; ``infos["group"]``, ``infos["group_episode"]``). ``env_wrappers=[W, ...]`` stacks
    Gymnasium wrappers on every sub-env (Gymnasium's own ``wrappers=`` argument is refused for
    vector entry points, hence the other name).
    ``render_mode`` is accepted for Gymnasium's sake; vector envs do not render. Every name is
    checked before a server, client or actor starts. An adapter whose constructor takes
    :data:`EXPECTED_SESSIONS` is told ``num_envs`` (an OpenEnv ``source`` sizes its server so).
    """
    from openenv_gym import vector
    from openenv_gym.vector.base import check_num_envs

    num_envs = check_num_envs(num_envs)  # an int from here on (numpy integers too)
    if backend not in vector.BACKENDS:
        close = difflib.get_close_matches(str(backend), vector.BACKENDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigurationError(f"unknown vector backend {backend!r}{hint}; use one of {', '.join(vector.BACKENDS)}")
    seat = _seat(kwargs)
    spec, env_kwargs = _adapter_and_env_kwargs(adapter, kwargs, also=VECTOR_KWARGS)
    if seat is not None:
        spec = _seat_spec(spec, *seat)
    env_kwargs.pop("render_mode", None)
    if EXPECTED_SESSIONS in (spec.accepted_here() or ()):
        spec.kwargs.setdefault(EXPECTED_SESSIONS, num_envs)
    if max_episode_steps is not None:
        turns = env_kwargs.get("max_turns")
        env_kwargs["max_turns"] = max_episode_steps if turns is None else min(turns, max_episode_steps)
    options = dict(vector_options or {})
    cls = vector.backend_class(backend, hosted="python" in env_kwargs)
    from openenv_gym.adapters.base import accepted_kwargs, check_kwargs

    takes = accepted_kwargs(cls)
    if takes is not None:
        own = {"num_envs", "adapter", "split", "max_turns", "step_timeout", "start_timeout", "python"}  # make_vec sets these
        check_kwargs(options, takes - own, f"vector_options of the {backend!r} backend")
    if autoreset_mode is not None:
        options["autoreset_mode"] = autoreset_mode
    if env_wrappers is not None:
        if "env_wrappers" not in (takes or ()):
            raise ConfigurationError(f"env_wrappers are not supported by the {backend!r} backend; use "
                                     "backend='concurrent'")
        options["env_wrappers"] = env_wrappers
    try:
        return vector.make(num_envs, spec, backend=backend, group_size=group_size, **env_kwargs, **options)
    except TypeError as exc:  # as in make_env: never let a TypeError reach a formatter of kwargs
        raise ConfigurationError(f"the vector environment could not be built: TypeError: {exc}") from exc


# -- registration ----------------------------------------------------------------------------------

def _register(id: str, kwargs: dict[str, Any], *, entry_point: Any = ENTRY_POINT, **extra: Any) -> None:
    """Put one spec into Gymnasium's registry, replacing an earlier one of the same id.

    ``gym.register`` scans the whole registry for a version conflict on every call, which made
    loading a catalog quadratic (8,000 entries took 5.5 s). A versioned id, which all of ours
    are, conflicts only with an unversioned spec of the same name: one dict lookup.
    """
    if entry_point == ENTRY_POINT:
        extra.setdefault("vector_entry_point", VECTOR_ENTRY_POINT)
    spec = RedactedEnvSpec(id=id, entry_point=entry_point, kwargs=kwargs, nondeterministic=True,
                           order_enforce=False, **extra)
    if spec.version is None:  # a plugin's unversioned id: Gymnasium's own (scanning) checks
        gym.registry.pop(spec.id, None)
        gym.register(id=id, entry_point=entry_point, kwargs=kwargs, nondeterministic=True,
                     order_enforce=False, **extra)
        return
    unversioned = get_env_id(spec.namespace, spec.name, None)
    if unversioned in gym.registry:
        raise gym.error.RegistrationError(
            f"cannot register {spec.id}: the unversioned environment {unversioned} already exists")
    gym.registry[spec.id] = spec  # replacing (a re-import of the catalog) should not warn


def register_builtins() -> None:
    """Register each backend's built-in id (``openenv/ORS-v0``, ``openenv/Fleet-v0``,
    ``openenv/Verifiers-v0``, ``openenv/OpenEnv-v0``...) and the bundled examples
    (``openenv/Arithmetic-v0``; ``openenv/KuhnPoker-v0``, verifiers' own two-seat game)."""
    for backend in backends.backends():
        if backend.builtin:
            _register(env_id(backend.builtin), {"adapter": backend.adapter})
    _register(env_id("Arithmetic"), {
        "adapter": ADAPTERS["ors"], "source": str(_EXAMPLES / "arithmetic.py"), "env_class": "Arithmetic",
        "max_turns": 8,
    })
    # A game (two seats): played through openenv_gym.multiagent; gym.make names that module.
    _register(env_id("KuhnPoker"), {"adapter": ADAPTERS["verifiers"], "source": str(_EXAMPLES / "kuhn_poker_v1")})


def register_catalog() -> list[str]:
    """Register every good entry of the user catalog; returns the ids.

    Bad entries (see :func:`~openenv_gym.importers.catalog.read_catalog`; a kind is bad unless
    :data:`ADAPTERS` has it) are skipped with one warning naming them all; an unreadable file
    only warns.
    """
    from openenv_gym.importers.catalog import (
        REMOVE_HINT,
        catalog_path,
        describe_invalid,
        read_catalog,
    )

    try:
        contents = read_catalog(kinds=ADAPTERS)
    except CatalogError as exc:
        warnings.warn(f"openenv_gym: the catalog was not loaded: {exc}", stacklevel=2)
        return []
    invalid = dict(contents.invalid)
    ids = []
    for entry in contents.entries.values():
        adapter = ADAPTERS[entry.kind]
        if "adapter" in entry.options:
            invalid[entry.name] = "its options may not set 'adapter' (the kind chooses it)"
            continue
        try:
            _register(env_id(entry.name), {**_catalog_kwargs(entry), **_isolation_kwargs(entry), **entry.options,
                                           "adapter": adapter})
        except Exception as exc:  # e.g. an unversioned id of the same name registered by someone else
            invalid[entry.name] = f"cannot be registered: {exc}"
            continue
        ids.append(env_id(entry.name))
    if invalid:
        plural = "entry" if len(invalid) == 1 else "entries"
        warnings.warn(
            f"openenv_gym: skipped {len(invalid)} invalid catalog {plural} in {catalog_path()}: "
            f"{describe_invalid(invalid)}; {REMOVE_HINT}",
            stacklevel=2,
        )
    return ids


def _catalog_kwargs(entry: Any) -> dict[str, Any]:
    """The ``gym.make`` kwargs that rebuild a catalog entry, as its kind's descriptor says."""
    backend = backends.get(entry.kind)
    if backend is None or backend.catalog_kwargs is None:
        return {"source": entry.source}
    return dict(backends.resolve(backend.catalog_kwargs)(entry))


def _isolation_kwargs(entry: Any) -> dict[str, Any]:
    """An isolated entry plays in its own venv: ``isolate=`` its Python version, or True."""
    if entry.isolated is None:
        return {}
    return {"isolate": entry.isolated.python or True}


def _register_discovered(what: str, discover: Callable[[], list[dict[str, Any]]],
                         kwargs_of: Callable[[dict[str, Any]], dict[str, Any]]) -> list[str]:
    """Register what ``discover`` found as ``openenv/<name>-v0``, each with ``kwargs_of(found)``.

    A failure only warns: discovery must never break ``import openenv_gym``.
    """
    try:
        found = discover()
    except Exception as exc:
        warnings.warn(f"openenv_gym: {what} discovery failed: {exc!r}", stacklevel=3)
        return []
    ids, failed = [], []
    for env in found:
        id = env_id(env["name"])
        try:
            _register(id, kwargs_of(env))
        except Exception:
            failed.append(env["name"])
            continue
        ids.append(id)
    if failed:
        warnings.warn(f"openenv_gym: {what} packages not registered (no valid id): {failed!r}", stacklevel=3)
    return ids


def register_discovered() -> list[str]:
    """Register the installed environment packages each backend discovers, as ``openenv/<name>-v0``.

    Discovery reads installed metadata only (cached per set of installed distributions); a package
    is loaded or served when made. A failure only warns: it must not break ``import openenv_gym``.
    """
    ids = []
    for backend in backends.backends():
        if backend.discover is None or backend.discovered_kwargs is None:
            continue
        kwargs_of = backends.resolve(backend.discovered_kwargs)

        def kwargs(found: dict[str, Any], b: backends.Backend = backend, k: Callable[..., dict[str, Any]] = kwargs_of) -> dict[str, Any]:
            return {"adapter": b.adapter, **k(found)}

        ids += _register_discovered(backend.kind, backends.resolve(backend.discover), kwargs)
    return ids


def _entry_points() -> list[Any]:
    """The ``openenv_gym.envs`` entry points, read from the installed metadata only when the
    installed set changed (cached as discovery is): reading them costs more than the rest of the
    import, and most installs have none."""
    from openenv_gym.importers.discovery import cache_dir, cached_scan

    def scan(paths: list[str]) -> list[dict[str, Any]]:
        from importlib import metadata

        return [{"name": ep.name, "value": ep.value} for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)]

    found = cached_scan(cache_dir() / "entry-points.json", scan)
    if not found:
        return []
    from importlib import metadata

    return [metadata.EntryPoint(e["name"], e["value"], ENTRY_POINT_GROUP) for e in found]


def register_entry_points() -> list[str]:
    """Register the environments of installed packages (entry-point group ``openenv_gym.envs``)."""
    ids = []
    for ep in _entry_points():
        try:
            for spec in ep.load()():
                kwargs = dict(spec.get("kwargs", {}))
                entry_point = spec.get("entry_point", ENTRY_POINT)
                if "adapter" in spec:
                    kwargs["adapter"] = spec["adapter"]
                elif entry_point in _LEGACY_ENTRY_POINTS:
                    kwargs.setdefault("adapter", _LEGACY_ENTRY_POINTS[entry_point])
                    entry_point = ENTRY_POINT
                _register(spec["id"], kwargs, entry_point=entry_point)
                ids.append(spec["id"])
        except Exception as exc:  # one broken plugin must not break `import openenv_gym`
            warnings.warn(f"openenv_gym: entry point {ep.name!r} failed: {exc!r}", stacklevel=2)
    return ids


def register_all() -> None:
    """Register built-ins, the catalog and entry points (called by ``import openenv_gym``)."""
    register_builtins()
    register_discovered()
    register_entry_points()
    register_catalog()


# -- lookup ----------------------------------------------------------------------------------------

def list_environments() -> list[str]:
    """Every registered id in the ``openenv`` namespace, sorted."""
    return sorted(i for i in gym.registry if i.startswith(f"{NAMESPACE}/"))


def _shown(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def check_id(id: str) -> str:
    """Return ``id`` if it is registered; else a :class:`ConfigurationError` with close matches.

    ``Arithmetic`` or ``openenv/Arithmetc-v0`` suggest ``openenv/Arithmetic-v0``.
    """
    if id in gym.registry:
        return id
    ours = list_environments()
    names: dict[str, list[str]] = {}
    for i in ours:
        names.setdefault(i[len(NAMESPACE) + 1:].rsplit("-v", 1)[0].lower(), []).append(i)
    # Compare names with names (any case): the shared "openenv/" and "-v0" make every id look close.
    asked = re.sub(r"-v\d+$", "", str(id).rsplit("/", 1)[-1]).lower()
    close = [i for n in difflib.get_close_matches(asked, list(names), n=3, cutoff=0.6) for i in names[n]]
    close += [i for i in difflib.get_close_matches(str(id), ours, n=3, cutoff=0.9) if i not in close]
    hint = (f"did you mean {' or '.join(close[:3])}?" if close
            else "`openenv-gym list` shows the registered ids")
    raise ConfigurationError(f"{_shown(id)} is not registered; {hint}")


def env_info(id: str) -> dict[str, Any]:
    """What an id is: its entry point and kwargs (secrets redacted), without building it."""
    spec = gym.registry[check_id(id)]
    kwargs = redact_kwargs(spec.kwargs or {})
    return {
        "id": spec.id,
        "entry_point": spec.entry_point if isinstance(spec.entry_point, str) else repr(spec.entry_point),
        "kwargs": kwargs,
        "nondeterministic": spec.nondeterministic,
    }
