"""A source file executed as a module of its own: the one way adapters import a user's file by path.

Loading from the file, rather than by name through ``sys.path``, means the file given is the one
used even when another folder on ``sys.path`` has a module of the same name.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from openenv_gym.errors import ConfigurationError

__all__ = ["exec_file"]


def exec_file(name: str, file: Path, *, package: bool = False, what: str = "source") -> ModuleType:
    """Execute ``file`` as the module ``name`` (a package's ``__init__.py`` with ``package``), in
    ``sys.modules`` under that name; a failure puts back whatever ``sys.modules`` held there
    before, and raises as the module did. A file that cannot be loaded at all is a
    :class:`~openenv_gym.errors.ConfigurationError` naming ``what``."""
    spec = importlib.util.spec_from_file_location(
        name, file, submodule_search_locations=[str(file.parent)] if package else None)
    if spec is None or spec.loader is None:
        raise ConfigurationError(f"cannot import {what} {str(file)!r}")
    module = importlib.util.module_from_spec(spec)
    existing = sys.modules.get(name)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if existing is not None:
            sys.modules[name] = existing
        else:
            sys.modules.pop(name, None)
        raise
    return module
