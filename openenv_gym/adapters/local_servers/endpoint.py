"""What an adapter composes to reach its server: a URL, or the local workers it launched.

Both the ORS and the OpenEnv adapters hold one :class:`Endpoint`. It owns what used to be copied
into each: the adapter's lifecycle (new, open, closed; a closed endpoint never launches again, and
one closed while its server was starting releases it at once), the one transport ("link") per
server, the placement of sessions (:meth:`Endpoint.lease`, sticky, least-loaded, within the
server's capacity), restarting dead workers before an episode (:meth:`Endpoint.ensure`), the exit
code of a worker that died in "cannot be reached" messages, and what another client needs to
connect (:meth:`Endpoint.connection`). The adapters keep only their protocol.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Collection
from typing import Any, Generic, Protocol, TypeVar

from openenv_gym.adapters.local_servers import group as groups
from openenv_gym.adapters.local_servers.group import Lease, RemoteServers, Server, ServerGroup, Servers
from openenv_gym.adapters.local_servers.processes import Launch
from openenv_gym.errors import BackendUnavailable, ConfigurationError

__all__ = ["Endpoint", "Link", "ServerReport"]


class Link(Protocol):
    """A transport to one server (``ORSTransport``, ``OpenEnvTransport``)."""

    async def aclose(self) -> None: ...


L = TypeVar("L", bound=Link)


class _State(enum.Enum):
    NEW = "new"  # built; not opened yet
    OPEN = "open"  # requests may go out, a dead local worker is restarted
    CLOSED = "closed"  # every entry point raises, nothing is launched again


class Endpoint(Generic[L]):
    """An adapter's server: placement of its sessions, one link per server, its lifecycle.

    Args:
        label: the backend's name in messages ("ORS", "OpenEnv").
        make_link: builds the transport to one server (a :class:`RemoteServer` for a URL, a
            :class:`~openenv_gym.adapters.local_servers.processes.Worker` for a launched source:
            its ``url``, ``auth_headers()`` and ``exit_note``).
    """

    def __init__(self, label: str, make_link: Callable[[Server], L]):
        self.label = label
        self._make_link = make_link
        self._state = _State.NEW
        self.servers: Servers | None = None
        self._links: dict[Any, L] = {}
        self._heal_lock: asyncio.Lock | None = None
        self._launch: tuple[Launch, int, int | None] | None = None
        self.here = False
        """True for an env run in this process (:meth:`open_here`)."""

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` has been called; a closed endpoint never opens again."""
        return self._state is _State.CLOSED

    @property
    def local(self) -> ServerGroup | None:
        """The launched workers, or ``None`` for a URL (or before the launch)."""
        return self.servers if isinstance(self.servers, ServerGroup) else None

    def check_open(self) -> None:
        if self._state is _State.CLOSED:
            raise BackendUnavailable(f"the {self.label} adapter is closed")

    def open_remote(self, url: str) -> None:
        """Use the server at ``url`` (a server this process did not launch)."""
        self.check_open()
        self._state = _State.OPEN
        self.servers = RemoteServers(url, f"{self.label} server")

    def open_here(self, name: str) -> None:
        """Use an env run in this process (``name`` stands for its address): one "server", no
        process, nothing another client could reach."""
        self.check_open()
        self._state = _State.OPEN
        self.servers = RemoteServers(name, f"{self.label} environment in this process")
        self.here = True

    async def open_local(self, launch: Launch, *, workers: int, expected_sessions: int | None) -> None:
        """Launch (or share) the workers serving ``launch``; see :func:`~.group.acquire`."""
        self.check_open()
        self._state = _State.OPEN
        self._launch = (launch, workers, expected_sessions)
        await self._acquire()

    async def _acquire(self) -> None:
        assert self._launch is not None
        launch, workers, expected = self._launch
        group = await groups.acquire(launch, workers=workers, expected_sessions=expected)
        if self.closed:  # closed while the server started: never leak it
            await asyncio.to_thread(groups.release, group)
            self.check_open()
        self.servers = group

    async def ensure(self) -> Collection[Server]:
        """Restart local workers that died; returns the servers that were replaced.

        Many sessions share an endpoint and may find a worker dead at once: only the first
        restarts it, the others wait for it; sessions on the other workers go on. The links to
        replaced workers are closed (their sessions died with them). A closed endpoint raises.
        """
        self.check_open()
        if self._launch is None:
            return ()
        if self._heal_lock is None:
            self._heal_lock = asyncio.Lock()
        group = self.local
        if group is not None and group.alive() and not self._heal_lock.locked():
            return ()
        async with self._heal_lock:
            self.check_open()
            if self.local is None:
                await self._acquire()
            elif not self.local.alive():
                await self.local.heal()
            self.check_open()
            current = set(self.servers.workers) if self.servers is not None else set()
            stale = [s for s in self._links if s not in current]
            for server in stale:
                await self._links.pop(server).aclose()
            return stale

    def died(self) -> bool:
        """True if a launched worker is no longer running."""
        return self.local is not None and not self.local.alive()

    def shut(self) -> None:
        """Refuse every new use from now on (links already handed out keep working until :meth:`aclose`)."""
        self._state = _State.CLOSED

    async def aclose(self) -> None:
        """Close for good: every link, and this user's hold on the launched workers."""
        self._state = _State.CLOSED
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(*(link.aclose() for link in links), return_exceptions=True)
        group = self.local
        if group is not None:
            self.servers = None
            await asyncio.to_thread(groups.release, group)

    # -- links and placement -------------------------------------------------------------------
    def _servers(self) -> Servers:
        self.check_open()
        if self.servers is None:
            raise BackendUnavailable(f"the {self.label} adapter is not started")
        return self.servers

    def link(self, server: Server | None = None) -> L:
        """The transport to ``server`` (made on first use); by default the first server's."""
        if server is None:
            server = self._servers().workers[0]
        else:
            self.check_open()
        link = self._links.get(server)
        if link is None:
            link = self._links[server] = self._make_link(server)
        return link

    async def place(self, idle_on: Collection[Server] = ()) -> Server:
        """The server for a new episode: least loaded, with room (more workers start if needed)."""
        return await self._servers().place(idle_on)

    async def lease(self) -> Lease:
        """A lease on the server :meth:`place` picks, counted there until released."""
        return Lease(await self.place())

    def learn(self, lease: Lease, max_sessions: int | None) -> int | None:
        """A session on ``lease``'s server was refused for capacity; see :meth:`Servers.learn`."""
        return self._servers().learn(lease, max_sessions)

    @property
    def can_grow(self) -> bool:
        """True when a full server can be helped by starting another worker."""
        return self.servers is not None and self.servers.can_grow

    @property
    def capacity(self) -> int | None:
        """Sessions one server allows, once known."""
        return self.servers.capacity if self.servers is not None else None

    # -- what adapters report ------------------------------------------------------------------
    def pid(self) -> int | None:
        """PID of the first launched worker (``None`` for a URL)."""
        return self.local.pid if self.local is not None else None

    def pids(self) -> list[int]:
        """PIDs of the launched workers, in slot order (``[]`` for a URL)."""
        return self.local.pids() if self.local is not None else []

    def sessions(self) -> list[int]:
        """Episodes in flight on each launched worker, in slot order, over every adapter sharing them."""
        return [w.busy for w in self.local.workers] if self.local is not None else []

    def connection(self, headers: dict[str, str]) -> dict[str, Any]:
        """``url`` and ``headers`` another client needs (the first server's; a local token is a secret)."""
        if self.here:
            raise ConfigurationError(f"the {self.label} environment runs in this process: there is no server "
                                     "another client could reach (serve it with `openenv-gym serve`)")
        server = self._servers().workers[0]
        return {"url": server.url, "headers": {**headers, **server.auth_headers()}}


class ServerReport:
    """What an adapter over an :class:`Endpoint` tells about its server (mixed into the ORS and
    OpenEnv adapters, which set ``endpoint`` and ``_headers``)."""

    endpoint: Endpoint[Any]
    _headers: dict[str, str]

    @property
    def closed(self) -> bool:
        """True once the adapter was closed; a closed adapter never opens again."""
        return self.endpoint.closed

    def server_died(self) -> bool:
        """True if this adapter launched a local server one of whose workers is no longer running."""
        return self.endpoint.died()

    def server_pid(self) -> int | None:
        """PID of the local server process (the first worker's), if this adapter launched one."""
        return self.endpoint.pid()

    def server_pids(self) -> list[int]:
        """PIDs of the local server's workers, in slot order (``[]`` with ``url=``)."""
        return self.endpoint.pids()

    def server_sessions(self) -> list[int]:
        """Episodes in flight on each worker, in slot order, over every adapter sharing them."""
        return self.endpoint.sessions()

    def connection(self) -> dict[str, Any]:
        """``url`` and ``headers`` another client needs to reach this adapter's server.

        For a local TCP server the headers hold its token: a secret, pass it on but never log it.
        ``gym.make(<the same id>, **adapter.connection())`` connects to the same server; with
        several workers that is the first one (its sessions then all run there).
        """
        return self.endpoint.connection(self._headers)
