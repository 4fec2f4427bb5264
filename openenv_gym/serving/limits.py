"""Every limit and default a served env's behaviour can hit, by name, in one place.

Standard library only: the command line reads its defaults here without loading the server.
"""

from __future__ import annotations

__all__ = [
    "PROTOCOLS", "MAX_SESSIONS", "SESSION_IDLE_TIMEOUT", "TOKEN_ENV", "MAX_REQUEST_BYTES", "MAX_MESSAGE_BYTES",
    "TASK_RANGE_LIMIT", "SSE_CHUNK", "SSE_PING_INTERVAL", "CALL_LINGER", "RETRY_AFTER", "END_TIMEOUT",
    "START_TIMEOUT", "STOP_TIMEOUT", "AUTH_TIMEOUT", "MAX_PENDING_CONNECTIONS", "WRONG_TOKENS_PER_SECOND",
    "MALFORMED_LOG_INTERVAL",
]

PROTOCOLS = ("ors", "openenv")
"""The protocols a served env speaks."""
MAX_SESSIONS = 64
"""Default ``max_sessions``: sessions served at once (the pool's size). One more is refused with
the protocol's capacity error (ORS: 503 with ``Retry-After``; OpenEnv: ``CAPACITY_REACHED``)."""
SESSION_IDLE_TIMEOUT = 900.0
"""Seconds a session may go without a request before it is ended (its client went away): the ORS
servers' own reaping time. A call in flight is not idleness."""
TOKEN_ENV = "OPENENV_GYM_TOKEN"
"""The environment variable a served env's token is read from when none is passed."""
MAX_REQUEST_BYTES = 8 * 2**20
"""The largest HTTP request body a served env reads (a bigger one is answered 413)."""
MAX_MESSAGE_BYTES = 16 * 2**20
"""The largest WebSocket message a served env reads (a bigger one closes the socket with 1009)."""
TASK_RANGE_LIMIT = 10_000
"""Most task specs one task-API request returns (``tasks``, ``task_range``); ask in ranges."""
SSE_CHUNK = 4096
"""Characters of an ORS tool call's result JSON per SSE event (the SDK servers' piece size)."""
SSE_PING_INTERVAL = 10.0
"""Seconds between keep-alive comments while an ORS tool call runs (clients time out a silent stream)."""
CALL_LINGER = 60.0
"""Seconds a finished ORS call's result is kept for a client resuming it by ``task_id``."""
RETRY_AFTER = 1
"""Seconds a client refused for capacity is told to wait (ORS ``Retry-After``)."""
END_TIMEOUT = 10.0
"""Seconds ending a session waits for its cancelled call to unwind before giving the slot back."""
START_TIMEOUT = 120.0
"""Seconds binding the server may take once its pool is up (the pool has its own ``start_timeout``)."""
STOP_TIMEOUT = 60.0
"""Seconds stopping may take: ending the sessions, then the app (closing the pool is bounded too)."""
AUTH_TIMEOUT = 10.0
"""Seconds a new connection has to send a request that passes the token check before it is closed
(a silent or half-sent connection would hold a file descriptor for ever)."""
MAX_PENDING_CONNECTIONS = 256
"""Most connections that have not yet passed the token check kept open at once; the oldest go first."""
WRONG_TOKENS_PER_SECOND = 10.0
"""Wrong tokens answered 403 per second (in bursts of twice that); beyond, 429 with ``Retry-After``.
The right token is never slowed."""
MALFORMED_LOG_INTERVAL = 10.0
"""Seconds between the lines that count malformed requests (aiohttp's parser refused them); none
quotes a request, which may hold a token."""
