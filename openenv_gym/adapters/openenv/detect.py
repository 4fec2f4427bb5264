"""OpenEnv environment folders and installed OpenEnv environment packages, found without importing them.

An OpenEnv environment is a folder (usually ``<name>_env/``) holding ``openenv.yaml`` (the
manifest: ``name``, ``app: server.app:app``, optionally ``version``, ``description``...) and
``server/app.py``, which builds the FastAPI app with ``openenv``'s ``create_app``. Installed as a
package (``pip install ./echo_env``), the same layout lives in ``site-packages/<name>_env/``,
often without the manifest (OpenEnv's own env packages do not ship it).

Everything here reads files and distribution metadata only; no environment code is imported
(that happens in the server process, at ``gym.make``):

* :func:`looks_like_openenv` / :func:`detect_openenv`: an environment folder, for
  ``openenv-gym import PATH --kind openenv``;
* :func:`resolve_source`: what to serve for a ``source=`` (a folder or an installed module name):
  the folder to put on ``sys.path`` and the ``module:attr`` of the app;
* :func:`discover_installed`: installed distributions that depend on ``openenv`` (or
  ``openenv-core``) and carry an ``openenv.yaml`` or the ``<name>_env/server/app.py`` layout;
  cached like Verifiers discovery, keyed by the set of installed distributions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib import metadata

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import msgspec

from openenv_gym.errors import DetectionError, SourceNotFound
from openenv_gym.importers import Detected
from openenv_gym.importers.discovery import cache_dir, cached_scan, top_modules

__all__ = ["OpenEnvSource", "MANIFEST", "MANIFEST_FIELDS", "read_manifest", "looks_like_openenv",
           "detect_openenv", "resolve_source", "discover_installed", "cache_path", "env_name_of"]

MANIFEST = "openenv.yaml"
DEFAULT_APP = "server.app:app"
MANIFEST_FIELDS = ("name", "version", "description", "type", "runtime", "app", "port", "spec_version")
"""Manifest fields shown by ``openenv-gym list``/``info`` (scalars only)."""

_REQ = re.compile(r"^\s*openenv(?:[-_]core)?\s*(?:[\[<>=!~;(@ ]|$)", re.IGNORECASE)
_MAX_MANIFEST_BYTES = 256 * 1024


class OpenEnvSource(msgspec.Struct):
    """What to serve: ``app`` (``module:attr``) importable with ``root`` first on ``sys.path``."""

    root: str
    app: str
    name: str
    folder: str
    manifest: dict[str, Any] = {}


def _scalar_manifest(text: str) -> dict[str, Any]:
    """Top-level ``key: value`` lines (the fallback when PyYAML is missing)."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_][\w-]*)\s*:\s*(.*?)\s*$", line)
        if m and m.group(2) and not m.group(2).startswith("#"):
            value = m.group(2).split(" #", 1)[0].strip().strip("'\"")
            out[m.group(1)] = int(value) if value.isdigit() else value
    return out


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest's scalar fields of :data:`MANIFEST_FIELDS` (``{}`` if there is none or it is unreadable)."""
    try:
        if path.stat().st_size > _MAX_MANIFEST_BYTES:
            return {}
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    try:
        import yaml

        data = yaml.safe_load(text)
    except ImportError:
        data = _scalar_manifest(text)
    except Exception:
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: data[k] for k in MANIFEST_FIELDS if isinstance(data.get(k), (str, int, float, bool))}


def env_name_of(name: str) -> str:
    """A manifest or module name as an id name: a trailing ``_env``/``-env`` only is dropped."""
    return re.sub(r"[_-]env$", "", name) or name


def _app_file(folder: Path, app: str) -> Path:
    module = app.partition(":")[0]
    return folder.joinpath(*module.split(".")).with_suffix(".py")


def looks_like_openenv(path: Path) -> bool:
    """A folder with ``openenv.yaml``, or with ``server/app.py`` next to ``models.py``."""
    if not path.is_dir():
        return False
    return (path / MANIFEST).is_file() or ((path / "server" / "app.py").is_file() and (path / "models.py").is_file())


def _folder_source(folder: Path) -> OpenEnvSource:
    manifest = read_manifest(folder / MANIFEST)
    app = str(manifest.get("app") or DEFAULT_APP)
    if not re.fullmatch(r"[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?", app):
        raise DetectionError(f"{folder / MANIFEST}: 'app' must be 'module:attr', not {app[:60]!r}")
    if not _app_file(folder, app).is_file():
        raise DetectionError(
            f"no OpenEnv environment in {folder}: looked for {MANIFEST} and the app it names "
            f"({app}, i.e. {_app_file(folder, app).relative_to(folder)})")
    name = str(manifest.get("name") or folder.name)
    if (folder / "__init__.py").is_file() and folder.name.isidentifier():
        # A package: its app imports `..models` relatively, so import it as `<folder>.server.app`.
        return OpenEnvSource(str(folder.parent), f"{folder.name}.{app}", name, str(folder), manifest)
    return OpenEnvSource(str(folder), app, name, str(folder), manifest)


def detect_openenv(source: str | os.PathLike[str]) -> OpenEnvSource:
    """The OpenEnv environment in folder ``source``, from its files only (never imported)."""
    path = Path(source).expanduser()
    if not path.exists():
        raise SourceNotFound(f"OpenEnv source {path} does not exist")
    path = path.resolve()
    if path.is_file():
        # server/app.py or openenv.yaml given directly: the environment is the folder around it.
        path = path.parent.parent if path.parent.name == "server" else path.parent
    return _folder_source(path)


def resolve_source(source: str | os.PathLike[str]) -> OpenEnvSource:
    """What to serve for ``source=``: an environment folder, or an installed package's module name.

    A module name is located with ``importlib.util.find_spec`` on the top-level name, which reads
    the import system's finders and never runs the package.
    """
    text = os.fspath(source)
    path = Path(text).expanduser()
    if path.exists():
        return detect_openenv(path)
    if re.fullmatch(r"[A-Za-z_]\w*", text):
        spec = importlib.util.find_spec(text)
        if spec is not None and spec.submodule_search_locations:
            folder = Path(next(iter(spec.submodule_search_locations)))
            found = _folder_source(folder) if (folder / MANIFEST).is_file() else None
            if found is None:
                if not (folder / "server" / "app.py").is_file():
                    raise DetectionError(f"installed package {text!r} has no server/app.py: not an OpenEnv environment")
                found = OpenEnvSource(str(folder.parent), f"{text}.{DEFAULT_APP}", text, str(folder))
            return found
    raise SourceNotFound(
        f"OpenEnv source {text[:100]!r} is neither a folder nor an installed environment package")


# -- discovery of installed environment packages ---------------------------------------------------

def cache_path() -> Path:
    """Where OpenEnv discovery caches its result: ``openenv-envs.json`` in :func:`cache_dir`."""
    return cache_dir() / "openenv-envs.json"


def _depends_on_openenv(dist: metadata.Distribution) -> bool:
    return any(_REQ.match(r) and "extra ==" not in r for r in dist.requires or ())


def _scan(paths: list[str]) -> list[dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    from importlib import metadata  # read only when the installed set changed

    for dist in metadata.distributions(path=paths):
        meta = dist.metadata  # PackageMetadata declares get() only from Python 3.12: the same lookup through `in`
        dist_name = meta["Name"] if "Name" in meta else None
        if not dist_name or dist_name.lower() in ("openenv", "openenv-core") or not _depends_on_openenv(dist):
            continue
        for module in top_modules(dist):
            folder = next((Path(p or ".") / module for p in paths if (Path(p or ".") / module).is_dir()), None)
            if folder is None:
                continue
            has_manifest = (folder / MANIFEST).is_file()
            if not has_manifest and not (module.endswith("_env") and (folder / "server" / "app.py").is_file()):
                continue
            manifest = read_manifest(folder / MANIFEST) if has_manifest else {}
            name = env_name_of(str(manifest.get("name") or module))
            if name.lower() in found:
                continue
            found[name.lower()] = {"name": name, "module": module, "distribution": dist_name,
                                   "version": dist.version, "manifest": manifest}
            break
    return sorted(found.values(), key=lambda e: e["name"].lower())


def discover_installed(paths: list[str] | None = None, *, use_cache: bool = True) -> list[dict[str, Any]]:
    """Installed OpenEnv environment packages: ``name``, ``module``, ``distribution``, ``version``, ``manifest``.

    ``paths`` are the folders to scan (default ``sys.path``). Cached in :func:`cache_path` under a
    fingerprint of the installed distributions; an install, upgrade or uninstall invalidates it.
    """
    return cached_scan(cache_path(), _scan, paths, use_cache=use_cache)


# -- the kind's detector, named by its descriptor -------------------------------------------------

def openenv_source(source: Path, env_class: str | None) -> Detected:
    """The OpenEnv environment folder ``source`` is."""
    found = detect_openenv(source)
    if env_class is not None and env_class != found.app:
        raise DetectionError(f"{source} serves {found.app}, not {env_class!r}")
    return Detected(kind="openenv", env_class=found.app, env_name=found.name,
                    module_file=found.app.partition(":")[0].replace(".", "/") + ".py",
                    sdk=str(found.manifest.get("version") or "openenv"), source=found.folder)
