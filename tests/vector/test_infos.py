"""The vector envs' infos are exactly what Gymnasium's ``VectorEnv._add_info`` gives.

:func:`~openenv_gym.vector.infos.stack_infos` builds a batch's infos a key at a time rather than
Gymnasium's sub-env at a time; a trainer reading ``infos["x"]`` and ``infos["_x"]`` must not see a
difference, for any nesting, type mix, ``final_obs``, keys missing from some infos, or order of
sub-envs: the batch of ``recv`` (info k at slot k) as well as ``step``'s and a partial
``reset``'s (the sub-envs' own slots of ``num_envs``).
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from openenv_gym.vector.infos import stack_infos

N = 5
leaf = st.one_of(st.integers(-5, 5), st.floats(allow_nan=False, width=32), st.booleans(), st.text(max_size=3),
                 st.none(), st.lists(st.integers(), max_size=2), st.just(np.float32(1.5)), st.just(np.arange(2)))
infos = st.recursive(
    st.dictionaries(st.sampled_from(["a", "b", "c", "final_obs"]), leaf, max_size=4),
    lambda inner: st.dictionaries(st.sampled_from(["a", "b", "x"]), inner, max_size=3), max_leaves=8)
# Several infos alike, as a batch mostly is (same keys, same types), with a few odd ones.
batches = st.one_of(
    st.lists(infos, max_size=N),
    st.tuples(infos, st.integers(1, N)).map(lambda pair: [pair[0]] * pair[1]),
)


class _Sized:
    """What Gymnasium's ``_add_info`` reads of its vector env (its recursion calls itself)."""

    _add_info = gym.vector.VectorEnv._add_info

    def __init__(self, size: int):
        self.num_envs = size


def _outcome(build: Any) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return build()
    except Exception as exc:  # both must fail alike on the same odd input
        return type(exc)


def _gymnasium(batch: list[dict], slots: list[int], size: int) -> Any:
    def build() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for info, slot in zip(batch, slots):
            out = _Sized(size)._add_info(out, info, slot)
        return out
    return _outcome(build)


def _same(ours: Any, theirs: Any) -> None:
    assert type(ours) is type(theirs)
    if isinstance(theirs, type):
        return
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs)  # the same keys in the same order
        for key in theirs:
            _same(ours[key], theirs[key])
        return
    if not isinstance(theirs, np.ndarray):  # Gymnasium's own oddities (a dict key that was a number)
        assert repr(ours) == repr(theirs)
        return
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert repr(ours.tolist()) == repr(theirs.tolist())


@settings(max_examples=400, deadline=None)
@given(batches)
def test_a_recv_batch_matches_gymnasium(batch: list[dict]) -> None:
    slots = list(range(len(batch)))
    _same(_outcome(lambda: stack_infos(batch, range(len(batch)), len(batch))), _gymnasium(batch, slots, len(batch)))


@settings(max_examples=400, deadline=None)
@given(batches, st.randoms(use_true_random=False))
def test_sub_envs_in_their_own_slots_match_gymnasium(batch: list[dict], rng: Any) -> None:
    slots = sorted(rng.sample(range(N), len(batch)))
    _same(_outcome(lambda: stack_infos(batch, slots, N)), _gymnasium(batch, slots, N))


def test_a_batch_of_alike_infos_is_stacked_by_key() -> None:
    info = {"calls": [{"name": "step", "ok": True}], "observation": {"metadata": {"steps": 1}, "x": 1},
            "turn": 2, "final_obs": [{"role": "tool"}]}
    out = stack_infos([info, {**info, "turn": 3}], range(2), 2)
    assert list(out) == ["calls", "_calls", "observation", "_observation", "turn", "_turn", "final_obs", "_final_obs"]
    assert out["calls"].dtype == object and out["calls"].shape == (2,) and out["calls"][1] == [{"name": "step", "ok": True}]
    assert out["turn"].tolist() == [2, 3] and out["turn"].dtype == np.int64 and out["_turn"].all()
    assert out["observation"]["metadata"]["steps"].tolist() == [1, 1]
    assert out["final_obs"][0] == [{"role": "tool"}]
