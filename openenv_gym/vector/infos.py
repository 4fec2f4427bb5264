"""A batch's infos in Gymnasium's shape: one array per key, with its ``_key`` mask.

:func:`stack_infos` gives what Gymnasium's ``VectorEnv._add_info`` gives when it is called for
each sub-env's info in turn, built a key at a time instead of a sub-env at a time: a first-ready
batch of 16 small infos (an OpenEnv step's holds ten keys, nested three deep) cost the per-key
bookkeeping of every sub-env's every key, more per env-step than the rest of ``recv``. A column
of numbers is placed in one numpy assignment and a mask that is all ``True`` is made whole; what
the key-at-a-time build cannot mirror exactly (a key that is a dict in one info and not in
another) is built by Gymnasium's own ``_add_info``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["stack_infos"]


class _Irregular(Exception):
    """A key holds a dict in one info and something else in another."""


class _Sized:
    """What Gymnasium's own ``VectorEnv._add_info`` reads of its vector env (its recursion calls
    itself): the irregular batches are built by Gymnasium's code, not a copy of it."""

    _add_info: Callable[..., dict[str, Any]] = gym.vector.VectorEnv._add_info

    def __init__(self, size: int):
        self.num_envs = size


def stack_infos(infos: Sequence[dict[str, Any]], slots: Sequence[int], size: int) -> dict[str, Any]:
    """Gymnasium's vector infos for ``infos``: info ``k`` fills slot ``slots[k]`` of arrays of
    length ``size``; each key's ``_key`` mask marks the slots whose info has it.

    Keys come in the order they are first met (info by info), each followed by its mask, as
    ``_add_info`` inserts them; a value's type in the first info that has the key sets the
    array's dtype (``final_obs`` and anything not a number or an array: an object array).
    """
    try:
        return _stacked(infos, slots, size)
    except _Irregular:
        merger = _Sized(size)
        out: dict[str, Any] = {}
        for info, slot in zip(infos, slots):
            out = merger._add_info(out, info, slot)
        return out


def _stacked(infos: Sequence[dict[str, Any]], slots: Sequence[int], size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not infos:
        return out
    first = infos[0]
    ordered = list(slots) == list(range(len(slots)))  # info k at slot k: a full column is the array
    same = len(set(map(tuple, infos))) == 1  # every info has the same keys in the same order
    keys = first if same else dict.fromkeys(key for info in infos for key in info)
    for key in keys:
        if same:
            where, values = slots, [info[key] for info in infos]
        else:
            present = [k for k, info in enumerate(infos) if key in info]
            where, values = [slots[k] for k in present], [infos[k][key] for k in present]
        full = len(values) == size
        kinds = set(map(type, values))
        dicts = sum(issubclass(kind, dict) for kind in kinds)
        if dicts and key != "final_obs":
            if dicts != len(kinds):
                raise _Irregular
            out[key] = _stacked(values, where, size)
        else:
            out[key] = _column(key, values, where, size, full and ordered)
        if full:
            mask = _all_true(size)
        else:
            mask = np.zeros(size, dtype=np.bool_)
            mask[list(where)] = True
        out[f"_{key}"] = mask
    return out


_TRUE: dict[int, np.ndarray] = {}


def _all_true(size: int) -> np.ndarray:
    """A fresh mask of ``size`` ``True``: a copy of one kept per size (``np.ones`` costs four times
    as much, and a batch asks for one per key)."""
    template = _TRUE.get(size)
    if template is None:
        template = _TRUE[size] = np.ones(size, dtype=np.bool_)
    return template.copy()


def _column(key: str, values: list[Any], where: Sequence[int], size: int, dense: bool) -> np.ndarray:
    """One key's array: ``values[k]`` at ``where[k]``, the rest zeros (numbers) or ``None``;
    ``dense``: ``where`` is every slot in order."""
    value = values[0]
    kind = type(value)
    if key != "final_obs" and (kind in (int, float, bool) or issubclass(kind, np.number)):
        try:  # each value converted as Gymnasium's item assignment converts it
            if dense:
                return np.array(values, dtype=kind)
            array = np.zeros(size, dtype=kind)
            array[list(where)] = values
            return array
        except Exception:  # a value that is no number: raise (or warn) as Gymnasium's would
            array = np.zeros(size, dtype=kind)
            for slot, item in zip(where, values):
                array[slot] = item
            return array
    if key != "final_obs" and isinstance(value, np.ndarray):
        array = np.zeros((size, *value.shape), dtype=value.dtype)
    elif dense:
        # Never np.array(values): a list of equal-length lists would become a 2-D array.
        return np.fromiter(values, dtype=object, count=size)
    else:
        array = np.full(size, fill_value=None, dtype=object)
    for slot, item in zip(where, values):
        array[slot] = item
    return array
