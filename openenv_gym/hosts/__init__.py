"""Adapter host processes: a shard under another interpreter (``python=``, ``isolate=True``).

:mod:`~openenv_gym.hosts.server` is the process (``python -m openenv_gym.hosts.server``) serving
one :class:`~openenv_gym.shard.shard.Shard` over a socketpair, in the frames of
:mod:`~openenv_gym.hosts.protocol`. A vector env reaches it through
:class:`~openenv_gym.hosts.process.ProcessHandle` (on the runtime loop); a single env through
:class:`~openenv_gym.hosts.runner.HostRunner` (blocking, on the caller's thread,
:mod:`~openenv_gym.hosts.blocking`). A Ray actor runs one on its node through
:class:`~openenv_gym.hosts.proxy.ShardProxy`.
"""
