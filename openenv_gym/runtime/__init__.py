"""The runtime: the one background event loop of a process, and the helpers every layer shares.

openenv_gym is async at the core and sync at the edges. This package holds what makes that work,
one module a job:

* :mod:`~openenv_gym.runtime.loop`: the process's loop on a daemon thread (:data:`RUNTIME`),
  :func:`run_sync` for the sync edges, and closing what was left open at interpreter exit;
* :mod:`~openenv_gym.runtime.caller_loop`: :class:`CallerLoop`, a single env's own loop, driven by
  the caller's thread while a call lasts;
* :mod:`~openenv_gym.runtime.deadlines`: :func:`within` and :class:`Deadlines`, time limits that
  name themselves;
* :mod:`~openenv_gym.runtime.retry`: :func:`retry` with :class:`Backoff`;
* :mod:`~openenv_gym.runtime.worker`: :class:`Worker`, a daemon thread for one session's blocking
  calls, and :class:`DaemonExecutor`, a pool of them that event loops take as their executor (a
  call that never returns does not hold up interpreter exit; the calls a task names in
  :data:`INLINE_OFFLOADS` run at once instead).

The module-level functions here are the process's :class:`~openenv_gym.runtime.loop.Runtime`'s
methods. Only public asyncio APIs are used.
"""

from __future__ import annotations

from openenv_gym.errors import RuntimeClosed
from openenv_gym.runtime.caller_loop import CallerLoop
from openenv_gym.runtime.deadlines import Deadlines, within
from openenv_gym.runtime.loop import EXIT_BUDGET, RUNTIME, Runtime
from openenv_gym.runtime.retry import Backoff, retry
from openenv_gym.runtime.worker import INLINE_OFFLOADS, DaemonExecutor, Worker

__all__ = [
    "get_loop", "run_sync", "submit", "post", "on_runtime", "retry", "Backoff", "track", "untrack",
    "RuntimeClosed", "EXIT_BUDGET", "within", "Deadlines", "close_later", "CallerLoop", "Runtime", "RUNTIME",
    "in_runtime_thread", "Worker", "DaemonExecutor", "INLINE_OFFLOADS",
]

get_loop = RUNTIME.get_loop
run_sync = RUNTIME.run_sync
submit = RUNTIME.submit
post = RUNTIME.post
on_runtime = RUNTIME.on_runtime
track = RUNTIME.track
untrack = RUNTIME.untrack
close_later = RUNTIME.close_later
in_runtime_thread = RUNTIME.in_runtime_thread
