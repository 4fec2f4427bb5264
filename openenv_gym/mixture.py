"""Mixtures: one vector env whose sub-envs belong to different environment ids.

``make_mixture({"openenv/A-v0": 32, "openenv/B-v0": 32})`` gives a trainer one Gymnasium vector
env over a weighted mixture of environments: each id's sub-envs are built exactly as
``gym.make_vec(id, n)`` builds them (their own adapters, servers, hosts, venvs: an id imported
``--isolated`` runs in its own venv, and ``isolate=True`` may be passed per id), and the mixture
drives them all through one :class:`~openenv_gym.vector.base.AgentVectorEnv`: one ``send``/``recv``
with first-ready results across every id, one autoreset mode, groups, ``rollout.run``.

Sub-envs are numbered in the order of the mapping: the first id's ``n`` sub-envs come first.
Each keeps its own tools: ``infos["tools"]`` at reset, ``single_action_spaces[i]``, and
``infos["env"]`` names the id of every result. ``single_action_space`` offers the union of the
tools (what a sampled batch action may call).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import msgspec
import numpy as np
from gymnasium.vector import AutoresetMode

from openenv_gym import runtime
from openenv_gym.errors import ConfigurationError
from openenv_gym.redact import RedactedSpec
from openenv_gym.session import STEP_TIMEOUT
from openenv_gym.shard.ops import Op, Result
from openenv_gym.spaces import AssistantAction
from openenv_gym.vector.base import AgentVectorEnv, VectorBackend
from openenv_gym.vector.groups import check_group_size

__all__ = ["MixtureVectorEnv", "make_mixture"]


class _Part:
    """One id's block of sub-envs: its vector env (kept for its attributes), its backend, its first index."""

    __slots__ = ("name", "envs", "backend", "offset", "size")

    def __init__(self, name: str, envs: AgentVectorEnv, offset: int):
        self.name, self.envs, self.offset, self.size = name, envs, offset, envs.num_envs
        self.backend: VectorBackend = envs.backend


class _Parts:
    """The mixture's backend: each id's own backend, its sub-env ids renumbered into the mixture's."""

    def __init__(self, parts: list[_Part]):
        self.parts = parts
        self._owner = [p for p in parts for _ in range(p.size)]
        self.deliver: Callable[[Result], None] = lambda result: None
        for part in parts:
            part.backend.deliver = functools.partial(self._from_part, part)

    def _tagged(self, part: _Part, result: Result) -> Result:
        result.env_id += part.offset
        result.info["env"] = part.name
        return result

    def _from_part(self, part: _Part, result: Result) -> None:
        self.deliver(self._tagged(part, result))

    def _by_part(self, env_ids: Iterable[int]) -> dict[int, tuple[_Part, list[int]]]:
        by_part: dict[int, tuple[_Part, list[int]]] = {}
        for i in env_ids:
            part = self._owner[i]
            by_part.setdefault(id(part), (part, []))[1].append(i - part.offset)
        return by_part

    def send(self, ops: list[Op]) -> None:
        by_part: dict[int, tuple[_Part, list[Op]]] = {}
        for op in ops:
            part = self._owner[op.env_id]
            by_part.setdefault(id(part), (part, []))[1].append(
                msgspec.structs.replace(op, env_id=op.env_id - part.offset))
        for part, part_ops in by_part.values():
            part.backend.send(part_ops)

    def run_here(self, op: Op) -> Coroutine[Any, Any, Result] | None:
        part = self._owner[op.env_id]
        direct = part.backend.run_here(msgspec.structs.replace(op, env_id=op.env_id - part.offset))
        return None if direct is None else self._tagged_later(part, direct)

    async def _tagged_later(self, part: _Part, direct: Coroutine[Any, Any, Result]) -> Result:
        return self._tagged(part, await direct)

    def settle(self, all_needed: bool, limit: float | None) -> list[Result] | None:
        here: list[Result] = []
        deadline = None if limit is None else time.monotonic() + limit
        for part in self.parts:
            # The parts share the caller's limit: each waits only for what is left of it.
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            results = part.backend.settle(all_needed, left)
            if results:
                here += [self._tagged(part, r) for r in results]
        return here or None

    async def cancel(self, env_ids: Iterable[int]) -> None:
        for part, local in self._by_part(env_ids).values():
            await part.backend.cancel(local)

    async def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        values: list[Any] = []
        for part in self.parts:
            values.extend(await part.backend.call(name, args, kwargs))
        return values

    async def call_one(self, env_id: int, name: str, args: tuple, kwargs: dict) -> Any:
        part = self._owner[env_id]
        return await part.backend.call_one(env_id - part.offset, name, args, kwargs)

    async def set_attr(self, name: str, values: Sequence[Any]) -> None:
        for part in self.parts:
            await part.backend.set_attr(name, values[part.offset:part.offset + part.size])

    async def aclose(self) -> None:
        await asyncio.gather(*(p.backend.aclose() for p in self.parts), return_exceptions=True)
        for part in self.parts:
            part.envs.closed = True  # its backend is closed; nothing is left for its own close()

    def release(self) -> None:
        for part in self.parts:
            part.backend.release()


class MixtureVectorEnv(RedactedSpec, AgentVectorEnv):
    """Sub-envs of several ids behind one vector env (see :func:`make_mixture`).

    Each part is a vector env of one id, used only for its backend: the mixture sends it ops
    renumbered to its own sub-envs and takes back its results, renumbered and tagged with
    ``info["env"]``; request ids, phases, autoreset, groups and first-ready order are the
    mixture's own.
    """

    def __init__(self, parts: list[tuple[str, AgentVectorEnv]], *, autoreset_mode: AutoresetMode | str,
                 step_timeout: float | None):
        blocks: list[_Part] = []
        offset = 0
        for name, envs in parts:
            runtime.untrack(envs)  # closed by the mixture, never on its own
            blocks.append(_Part(name, envs, offset))
            offset += envs.num_envs
        self._parts = blocks
        owner = [p for p in blocks for _ in range(p.size)]
        self.env_names: tuple[str, ...] = tuple(p.name for p in owner)
        """The id of each sub-env."""
        self.single_action_spaces: tuple[AssistantAction, ...] = tuple(
            p.envs.single_action_space for p in owner)  # type: ignore[misc]
        """Each sub-env's own action space (its id's tools)."""
        tools: dict[str, Any] = {}
        for part in blocks:
            for tool in part.envs.single_action_space.tools:  # type: ignore[attr-defined]
                tools.setdefault(tool.name, tool)
        super().__init__(offset, list(tools.values()), _Parts(blocks), autoreset_mode=autoreset_mode,
                         step_timeout=step_timeout, any_action=any(p.envs._any_action for p in blocks))

    @property
    def parts(self) -> dict[str, AgentVectorEnv]:
        """Each id's vector env (its backend: actors, host processes...)."""
        return {p.name: p.envs for p in self._parts}


def make_mixture(
    weights: Mapping[str, int],
    *,
    backend: str = "concurrent",
    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
    step_timeout: float | None = STEP_TIMEOUT,
    group_size: int | None = None,
    vector_options: dict[str, Any] | None = None,
    env_kwargs: Mapping[str, dict[str, Any]] | None = None,
    **common: Any,
) -> MixtureVectorEnv:
    """One vector env over ``weights[id]`` sub-envs of each id.

    Args:
        weights: registered id -> how many sub-envs (in this order).
        backend, autoreset_mode, step_timeout, vector_options: as for ``gym.make_vec``, for every id.
        group_size: groups of that many consecutive sub-envs share tasks; each id's count must be
            a multiple of it, so no group spans two ids.
        env_kwargs: per-id ``gym.make_vec`` kwargs (``split``, ``max_turns``, ``isolate=True``,
            ``python=``, ``env_wrappers``...), on top of ``common`` (kwargs for every id).

    Every argument is checked (a mapping of registered openenv ids to positive integer counts,
    Python's or numpy's; a dict of kwargs per id; ``group_size``) before anything starts, each
    mistake a :class:`~openenv_gym.errors.ConfigurationError` saying what was expected; if one
    part fails to start, the parts already started are closed.
    """
    weights = _checked_weights(weights)
    per_id = _checked_env_kwargs(env_kwargs, weights)
    group_size = _positive_int(group_size, "group_size") if group_size is not None else None
    for name, n in weights.items():
        if group_size is not None and n % group_size:
            raise ConfigurationError(f"{name!r} has {n} sub-envs, not a multiple of group_size={group_size} "
                                     "(a group must not span two ids)")
    check_group_size(sum(weights.values()), group_size)
    try:
        autoreset_mode = AutoresetMode(autoreset_mode)
    except ValueError:
        raise ConfigurationError(f"autoreset_mode must be one of {', '.join(m.value for m in AutoresetMode)}, "
                                 f"not {autoreset_mode!r}") from None
    parts: list[tuple[str, AgentVectorEnv]] = []
    try:
        for name, n in weights.items():
            kwargs = {**common, **per_id.get(name, {})}
            envs = gym.make_vec(name, num_envs=n, backend=backend, vector_options=vector_options,
                                autoreset_mode=autoreset_mode, step_timeout=step_timeout, **kwargs)
            if not isinstance(envs.unwrapped, AgentVectorEnv):  # a plugin's entry point that is not ours
                envs.close()
                raise ConfigurationError(f"{name!r} did not make an openenv_gym vector env "
                                         f"({type(envs.unwrapped).__name__}): a mixture mixes openenv ids only")
            parts.append((name, envs.unwrapped))
        mixture = MixtureVectorEnv(parts, autoreset_mode=autoreset_mode, step_timeout=step_timeout)
    except BaseException:
        for _, envs in parts:
            try:
                envs.close()
            except Exception:
                pass
        raise
    mixture.use_groups(group_size)
    return mixture


def _positive_int(value: Any, what: str) -> int:
    """``value`` as an ``int`` if it is a positive integer (Python's or numpy's, never a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigurationError(f"{what} must be a positive integer, not {value!r}")
    return int(value)


def _checked_weights(weights: Any) -> dict[str, int]:
    """``weights`` as ``{id: count}``, every id a registered openenv id and every count positive."""
    from openenv_gym.registration import VECTOR_ENTRY_POINT, check_id

    if not isinstance(weights, Mapping):
        raise ConfigurationError("make_mixture takes a mapping of id -> number of sub-envs, e.g. "
                                 f"{{'openenv/Arithmetic-v0': 32}}, not a {type(weights).__name__}")
    if not weights:
        raise ConfigurationError("make_mixture needs at least one id")
    checked: dict[str, int] = {}
    for name, n in weights.items():
        if not isinstance(name, str):
            raise ConfigurationError(f"the mixture's ids must be strings, not {name!r}")
        spec = gym.registry[check_id(name)]
        if spec.vector_entry_point != VECTOR_ENTRY_POINT:
            raise ConfigurationError(f"{name!r} is not an openenv id (its vector entry point is "
                                     f"{spec.vector_entry_point!r}): a mixture mixes openenv ids only, "
                                     "see `openenv-gym list`")
        checked[name] = _positive_int(n, f"the mixture's count for {name!r}")
    return checked


def _checked_env_kwargs(env_kwargs: Any, weights: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """``env_kwargs`` as ``{id: {kwarg: value}}``, every id one of the mixture's."""
    if env_kwargs is None:
        return {}
    if not isinstance(env_kwargs, Mapping):
        raise ConfigurationError("env_kwargs must map ids to dicts of kwargs, e.g. "
                                 f"{{'openenv/X-v0': {{'isolate': True}}}}, not a {type(env_kwargs).__name__}")
    unknown = [k for k in env_kwargs if k not in weights]
    if unknown:
        raise ConfigurationError(f"env_kwargs name ids that are not in the mixture: {sorted(map(str, unknown))}")
    for name, kwargs in env_kwargs.items():
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise ConfigurationError(f"env_kwargs[{name!r}] must be a dict of kwargs, not {kwargs!r:.80}")
    return {name: dict(kwargs) for name, kwargs in env_kwargs.items()}
