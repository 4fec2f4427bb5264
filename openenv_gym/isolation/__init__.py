"""Isolation: each environment in its own Python environment, built from its own requirements.

* :mod:`~openenv_gym.isolation.paths` -- where snapshots and venvs live (the package's data dir).
* :mod:`~openenv_gym.isolation.snapshot` -- a frozen copy of an imported source, secrets left out.
* :mod:`~openenv_gym.isolation.venvs` -- the requirements of a source and the venv ``uv`` builds
  from them, cached by their hash; :func:`~openenv_gym.isolation.venvs.python_for` is what a host
  process (:mod:`openenv_gym.hosts`) asks for when an env is made with ``isolate=True``.

``openenv-gym install`` (fetch, show, ask, import) is :mod:`openenv_gym.install`, above this
package and :mod:`openenv_gym.importing`, which both build on it.
"""
