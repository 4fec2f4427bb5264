"""Local servers: private server processes for local sources, shared and placed by session.

The ORS and OpenEnv adapters serve a local ``source`` the same way, so they compose this one
component: :mod:`.processes` (one worker process: private directory, launch, readiness, log,
stop), :mod:`.group` (the workers of one source, the leases sessions hold on them, capacity, the
process's registry) and :mod:`.endpoint` (what an adapter holds: a URL or its launched workers,
one link per server, its lifecycle). See docs/architecture.md, Local servers.
"""

from openenv_gym.adapters.local_servers.endpoint import Endpoint, ServerReport
from openenv_gym.adapters.local_servers.group import (
    MAX_DEFAULT_WORKERS,
    MAX_SERVER_WORKERS,
    SESSIONS_PER_WORKER,
    Lease,
    ServerGroup,
    check_in_process,
    check_workers,
    default_workers,
    stop_all,
)
from openenv_gym.adapters.local_servers.processes import LISTEN_MODES, LOG_MAX_BYTES, Launch, Worker, sweep_stale

__all__ = [
    "Endpoint", "ServerReport", "Lease", "Launch", "ServerGroup", "Worker", "check_in_process", "check_workers", "default_workers",
    "stop_all",
    "sweep_stale", "LISTEN_MODES", "LOG_MAX_BYTES", "MAX_DEFAULT_WORKERS", "MAX_SERVER_WORKERS",
    "SESSIONS_PER_WORKER",
]
