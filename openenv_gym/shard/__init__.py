"""The shard: where sub-env sessions live, and how a driver reaches them.

A :class:`~openenv_gym.shard.shard.Shard` owns the sessions of some sub-envs and answers
:class:`~openenv_gym.shard.ops.Op` requests with :class:`~openenv_gym.shard.ops.Result` answers.
The same class runs in this process, in an adapter host process and in a Ray actor; a driver
reaches it through a :class:`~openenv_gym.shard.handle.Handle`. This package sits below
:mod:`openenv_gym.vector` and :mod:`openenv_gym.hosts`, which both build on it and never on each
other's insides.
"""

from __future__ import annotations

from openenv_gym.shard.handle import EncodedHandle, Handle, LocalHandle
from openenv_gym.shard.ops import Op, OpKind, Result
from openenv_gym.shard.shard import Shard, ShardConfig

__all__ = ["Shard", "ShardConfig", "Handle", "LocalHandle", "EncodedHandle", "Op", "OpKind", "Result"]
