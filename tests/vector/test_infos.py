"""The vector envs' info merging gives exactly what Gymnasium's ``VectorEnv._add_info`` gives.

:meth:`AgentVectorEnv._add_info` is a faster copy of Gymnasium's (it skips building a mask array
per key per call); a trainer reading ``infos["x"]`` and ``infos["_x"]`` must not see a difference,
for any nesting, type mix, ``final_obs`` or order of sub-envs.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from openenv_gym.vector.base import AgentVectorEnv

N = 5
leaf = st.one_of(st.integers(-5, 5), st.floats(allow_nan=False, width=32), st.booleans(), st.text(max_size=3),
                 st.none(), st.lists(st.integers(), max_size=2), st.just(np.float32(1.5)), st.just(np.arange(2)))
infos = st.recursive(
    st.dictionaries(st.sampled_from(["a", "b", "c", "final_obs"]), leaf, max_size=4),
    lambda inner: st.dictionaries(st.sampled_from(["a", "b", "x"]), inner, max_size=3), max_leaves=8)


class _Sized:
    num_envs = N


def _merge(add: Any, seq: list[tuple[dict, int]]) -> Any:
    out: dict[str, Any] = {}
    try:
        for info, env_num in seq:
            out = add(_Sized(), out, info, env_num)
    except Exception as exc:  # both must fail alike on the same odd input
        return type(exc)
    return out


def _same(ours: Any, theirs: Any) -> None:
    assert type(ours) is type(theirs)
    if isinstance(theirs, type):
        return
    if isinstance(theirs, dict):
        assert ours.keys() == theirs.keys()
        for key in theirs:
            _same(ours[key], theirs[key])
        return
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert repr(ours.tolist()) == repr(theirs.tolist())


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(infos, st.integers(0, N - 1)), max_size=6))
def test_add_info_matches_gymnasium(seq: list[tuple[dict, int]]) -> None:
    _same(_merge(AgentVectorEnv._add_info, seq), _merge(gym.vector.VectorEnv._add_info, seq))
