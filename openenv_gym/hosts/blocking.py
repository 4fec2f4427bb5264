"""BlockingHost: a host process driven from the caller's own thread, for one env (``gym.make``).

A single env makes one request at a time and waits for it, so its driver needs no event loop:
the caller's thread writes the frame and reads the answer on a blocking socket. Going through the
runtime loop instead would add a hop to the loop's thread and back on every step (two thread
wake-ups, a task and a future), which is most of what a host process adds to a step; vector envs,
which keep many requests in flight, drive their hosts from the loop
(:class:`~openenv_gym.hosts.process.HostProcess`). Both speak the same frames
(:mod:`openenv_gym.hosts.protocol`) to the same host.

Every wait is bounded (``timeout``, in :class:`~openenv_gym.errors.BackendTimeout`) and sliced
in 0.1 s reads, so Ctrl-C is seen promptly even when the signal lands on another thread. A request
given up (its timeout, Ctrl-C) leaves its answer to come later: answers are matched by id, so a
late one is dropped, never taken for the next request's. The host dying or its stream breaking
raises :class:`~openenv_gym.errors.HostDied` at once, with the end of its output.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO, Any

import msgspec

from openenv_gym.errors import BackendTimeout, HostDied, from_wire
from openenv_gym.hosts.process import INIT_TIMEOUT, gone_message, init_body, init_failed, kill_group, spawn
from openenv_gym.hosts.protocol import Frame, Kind, pack, unpack
from openenv_gym.processes import is_stopped
from openenv_gym.shard.shard import ShardConfig

__all__ = ["BlockingHost"]

_SLICE = 0.1
"""Seconds one blocking read may wait before the thread looks at its signals and its deadline."""
_decode_info = msgspec.msgpack.Decoder(dict[str, Any])


class BlockingHost:
    """One host process and its socket, used by one thread at a time (a lock keeps it so)."""

    def __init__(self, python: str, init: ShardConfig):
        self.python = python
        self._init = init
        self.process: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._output: IO[bytes] | None = None
        self._buffer = bytearray()
        self._next_id = 0
        self._lock = threading.Lock()
        self.gone: str | None = None
        """Why the host is gone (``None`` while it runs)."""
        self.info: dict[str, Any] = {}
        """What the host said at ``init``: its protocol, openenv_gym version and Python."""

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def open(self, timeout: float = INIT_TIMEOUT) -> None:
        """Start the process and build its host (errors as :meth:`HostProcess.open
        <openenv_gym.hosts.process.HostProcess.open>` raises them)."""
        self.process, self._sock, self._output = spawn(self.python)
        try:
            reply, _ = self.request(Kind.INIT, init_body(self._init), timeout=timeout)
        except BackendTimeout:
            self.kill()
            raise init_failed(self.python, TimeoutError(), timeout) from None
        except BaseException as exc:
            self.kill()
            raise init_failed(self.python, exc, timeout) from None
        self.info = _decode_info.decode(reply)

    # -- requests --------------------------------------------------------------------------------
    def request(self, method: Kind, body: bytes = b"", *, timeout: float | None = None,
                what: str | None = None, limit: str = "step_timeout",
                abandoned: Callable[[], None] | None = None) -> tuple[bytes, list[bytes]]:
        """Send one request and wait for its answer: ``(reply body, results frames' bodies)``.

        ``timeout`` bounds the wait (:class:`BackendTimeout` naming ``what`` and ``limit``, as
        :func:`~openenv_gym.runtime.run_sync` words it); ``abandoned`` runs when the wait is given
        up (timeout, Ctrl-C), to tell the host to stop the work.
        """
        with self._lock:
            return self._request(method, body, timeout, what, limit, abandoned)

    def _request(self, method: Kind, body: bytes, timeout: float | None, what: str | None, limit: str,
                 abandoned: Callable[[], None] | None) -> tuple[bytes, list[bytes]]:
        if self.gone is not None:
            raise HostDied(self.gone)
        self._next_id += 1
        call_id = self._next_id
        deadline = None if timeout is None else time.monotonic() + timeout
        streamed: list[bytes] = []
        try:
            self._send(Frame(call_id, method, body), deadline)
            while True:
                frame = self._read(deadline)
                if frame is None:
                    raise BackendTimeout(f"{what or method.name} did not finish within {limit}={timeout} s")
                if frame.id != call_id:
                    continue  # the late answer of a request given up earlier
                if frame.kind is Kind.RESULTS:
                    streamed.append(frame.body)
                elif frame.kind is Kind.ERROR:
                    raise from_wire(frame.error or {})
                else:
                    return frame.body, streamed
        except (BackendTimeout, KeyboardInterrupt, SystemExit):
            if abandoned is not None and self.gone is None:
                with contextlib.suppress(Exception):
                    abandoned()
            raise

    def notify(self, method: Kind, body: bytes = b"") -> None:
        """Send a request whose answer nobody waits for (``cancel``); never blocks long, never raises."""
        if self.gone is None and self._sock is not None:
            with contextlib.suppress(OSError, HostDied):
                self._send(Frame(0, method, body), time.monotonic() + 1.0)

    def _send(self, frame: Frame, deadline: float | None) -> None:
        assert self._sock is not None
        self._sock.settimeout(None if deadline is None else max(0.01, deadline - time.monotonic()))
        try:
            self._sock.sendall(pack(frame))
        except TimeoutError:  # the host reads nothing (it is stopped): as good as gone
            self._lost("it stopped reading its socket")
            raise HostDied(self.gone or "") from None
        except OSError as exc:
            self._lost(str(exc) or type(exc).__name__)
            raise HostDied(self.gone or "") from None

    def _read(self, deadline: float | None) -> Frame | None:
        """The next frame, or ``None`` past ``deadline``."""
        sock = self._sock
        assert sock is not None
        while True:
            try:
                frame = unpack(self._buffer)
            except ValueError as exc:
                self._lost(str(exc))
                raise HostDied(self.gone or "") from None
            if frame is not None:
                return frame
            wait = _SLICE
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                wait = min(wait, left)
            sock.settimeout(wait)
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError as exc:
                self._lost(str(exc) or type(exc).__name__)
                raise HostDied(self.gone or "") from None
            if not chunk:
                self._lost("its stream ended")
                raise HostDied(self.gone or "")
            self._buffer += chunk

    def _lost(self, why: str) -> None:
        if self.gone is None:
            if self.process is not None:  # it may be exiting: its code says more than the socket
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(0.2)
            self.gone = gone_message(self.process, why, self._output)

    # -- end -------------------------------------------------------------------------------------
    def close(self, timeout: float) -> None:
        """Ask the host to close its env, then end it; kill it past ``timeout``. Never raises.

        A request still running on another thread (a step that hangs) is not waited for: the
        socket is shut under it (the host sees its driver leave and exits; that request gets
        :class:`HostDied`).
        """
        if self.process is not None and is_stopped(self.process.pid):
            self.kill()  # stopped (SIGSTOP): it would answer nothing, and a kill is all it can take
        got = self._lock.acquire(timeout=1.0)
        try:
            if got and self.gone is None and self._sock is not None and self.process is not None \
                    and self.process.poll() is None:
                with contextlib.suppress(BaseException):
                    self._request(Kind.CLOSE, b"", timeout, None, "the close limit", None)
                self.notify(Kind.BYE)
            elif not got and self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
        finally:
            if got:
                self._lock.release()
        self._reap(5.0)

    def _reap(self, timeout: float) -> None:
        process = self.process
        if process is not None:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(5.0)
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        if self.gone is None:
            self.gone = gone_message(process, "it was closed", None)
        if self._output is not None:
            with contextlib.suppress(Exception):
                self._output.close()
            self._output = None

    def kill(self) -> None:
        """SIGKILL the host's whole process group (its servers too); never raises."""
        kill_group(self.process)

    def check_alive(self, timeout: float) -> bool:
        """Whether the host answers a liveness check within ``timeout`` s; one that does not
        (stopped, frozen, its stream corrupted) is killed and marked gone."""
        if self.gone is not None:
            return False
        if self.process is not None and is_stopped(self.process.pid):
            self.gone = f"the host process (pid {self.pid}) is stopped (SIGSTOP); it was killed"
            self.kill()
            return False
        try:
            self.request(Kind.PID, timeout=timeout, what="the liveness check", limit="its timeout")
            return True
        except Exception:  # noqa: BLE001 - no answer, or no usable answer: as good as dead
            if self.gone is None:
                self.gone = (f"the host process (pid {self.pid}) stopped answering (no answer to a liveness "
                             f"check within {timeout} s after a missed deadline); it was killed")
            self.kill()
            return False
