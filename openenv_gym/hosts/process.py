"""HostProcess: an adapter host (:mod:`openenv_gym.hosts.server`) under another interpreter.

The driver's side of the host process: it starts ``python -m openenv_gym.hosts.server`` with one
end of a ``socketpair`` (so nothing else on the machine can reach the host), builds the
:class:`~openenv_gym.shard.shard.Shard` there with an ``INIT`` frame, then sends requests and
matches answers by id. :class:`ProcessHandle` is the :class:`~openenv_gym.shard.handle.Handle` a
vector env's driver holds for it.

The host gets its own session (a terminal's Ctrl-C is the trainer's to handle) and dies with the
driver (``PR_SET_PDEATHSIG``, and end of stream on its socket). If it dies or its stream breaks,
every request waiting on it fails at once with :class:`~openenv_gym.errors.HostDied`, with the
end of the host's stderr in the message: never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import socket
import subprocess
import tempfile
from collections.abc import Callable
from typing import IO, Any

import msgspec

from openenv_gym.errors import ConfigurationError, HostDied, OpenEnvGymError, from_wire
from openenv_gym.hosts.protocol import PROTOCOL, Frame, Kind, read_frame, write_frame
from openenv_gym.processes import is_stopped
from openenv_gym.shard.handle import EncodedHandle
from openenv_gym.shard.ops import Result, decode_results
from openenv_gym.shard.shard import ShardConfig, decode_tools
from openenv_gym.tracebacks import summarize, whole_lines
from openenv_gym.wire import ToolSpec

__all__ = ["HostProcess", "ProcessHandle", "INIT_TIMEOUT", "spawn", "init_body", "init_failed", "gone_message",
           "kill_group"]

INIT_TIMEOUT = 120.0
"""Default seconds a host process may take to import openenv_gym and answer ``INIT``; the caller's
start limit caps it (its adapters' start, which may launch servers, is a separate request)."""
_STDERR_TAIL = 2000
_msgpack = msgspec.msgpack.Encoder()
_decode_info = msgspec.msgpack.Decoder(dict[str, Any])
_decode_int = msgspec.msgpack.Decoder(int)


class HostProcess:
    """One host process and the requests in flight to it. Use on the runtime loop only."""

    def __init__(self, python: str, init: ShardConfig):
        self.python = python
        self._init = init
        self.process: subprocess.Popen[bytes] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self._streams: dict[int, Callable[[bytes], None]] = {}
        self._next_id = 0
        self._stderr: Any = None
        self.gone: str | None = None
        """Why the host is gone (``None`` while it runs)."""
        self.info: dict[str, Any] = {}
        """What the host said at ``init``: its protocol, openenv_gym version and Python."""

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    # -- start -----------------------------------------------------------------------------------
    async def open(self, timeout: float = INIT_TIMEOUT) -> None:
        """Start the process and build its host; :class:`ConfigurationError` if the interpreter
        cannot run one (openenv_gym missing there, another version), :class:`HostDied` if it dies."""
        self.process, ours, self._stderr = spawn(self.python)
        reader, self._writer = await asyncio.open_unix_connection(sock=ours, limit=1 << 20)
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))
        try:
            async with asyncio.timeout(timeout):
                reply = await self.request(Kind.INIT, init_body(self._init))
        except BaseException as exc:
            self.kill()
            raise init_failed(self.python, exc, timeout) from None
        self.info = _decode_info.decode(reply)

    def stderr_tail(self) -> str:
        return output_tail(self._stderr)

    # -- requests --------------------------------------------------------------------------------
    async def _read(self, reader: asyncio.StreamReader) -> None:
        why = "its stream ended"
        try:
            while (frame := await read_frame(reader)) is not None:
                if frame.kind is Kind.RESULTS:
                    stream = self._streams.get(frame.id)
                    if stream is not None:
                        stream(frame.body)
                    continue
                future = self._waiting.pop(frame.id, None)
                if future is None or future.done():
                    continue
                if frame.kind is Kind.ERROR:
                    future.set_exception(from_wire(frame.error or {}))
                else:
                    future.set_result(frame.body)
        except (ValueError, ConnectionError) as exc:
            why = str(exc)
        except asyncio.CancelledError:
            why = "the driver closed it"
        self._lost(why)

    def _lost(self, why: str) -> None:
        if self.gone is not None:
            return
        self.gone = gone_message(self.process, why, self._stderr)
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(HostDied(self.gone))
        self._streams.clear()

    async def request(self, method: Kind, body: bytes = b"", stream: Callable[[bytes], None] | None = None) -> bytes:
        """Send one request and wait for its answer; ``stream`` gets each ``results`` frame."""
        if self.gone is not None:
            raise HostDied(self.gone)
        assert self._writer is not None
        self._next_id += 1
        call_id = self._next_id
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        if stream is not None:
            self._streams[call_id] = stream
        try:
            write_frame(self._writer, Frame(call_id, method, body))
            return await future
        finally:
            self._waiting.pop(call_id, None)
            self._streams.pop(call_id, None)

    def notify(self, method: Kind, body: bytes = b"") -> None:
        """Send a request whose answer nobody waits for."""
        if self.gone is None and self._writer is not None:
            write_frame(self._writer, Frame(0, method, body))

    # -- end -------------------------------------------------------------------------------------
    async def close(self, timeout: float) -> None:
        """Ask the host to close its env, then end it; kill it past ``timeout``. Never raises."""
        if self.process is not None and is_stopped(self.process.pid):
            self.kill()  # stopped (SIGSTOP): it would answer nothing, and a kill is all it can take
        with contextlib.suppress(BaseException):
            if self.gone is None and self.process is not None and self.process.poll() is None:
                async with asyncio.timeout(timeout):
                    await self.request(Kind.CLOSE)
        with contextlib.suppress(BaseException):
            self.notify(Kind.BYE)
            if self._writer is not None:
                self._writer.close()
        await self._reap(timeout=5.0)

    async def _reap(self, timeout: float) -> None:
        process = self.process
        if process is not None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while process.poll() is None and loop.time() < deadline:
                await asyncio.sleep(0.02)
            if process.poll() is None:
                self.kill()
                while process.poll() is None:
                    await asyncio.sleep(0.01)
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(BaseException):
                await self._reader_task
        self._lost("it was closed")
        if self._stderr is not None:
            with contextlib.suppress(Exception):
                self._stderr.close()
            self._stderr = None

    def kill(self) -> None:
        """SIGKILL the host's whole process group (its servers too); never raises."""
        kill_group(self.process)


class ProcessHandle(EncodedHandle):
    """A shard in a :class:`HostProcess` (results streamed as they finish).

    ``init_timeout``: seconds the process may take to answer ``INIT`` (the caller's start limit).
    """

    label = "host process"

    def __init__(self, python: str, init: ShardConfig, *, init_timeout: float = INIT_TIMEOUT):
        super().__init__(any_action=bool(init.env_wrappers))
        self.process = HostProcess(python, init)
        self._init_timeout = init_timeout

    async def start(self) -> list[ToolSpec]:
        if self.process.process is None:
            await self.process.open(self._init_timeout)
        return decode_tools(await self.process.request(Kind.START))

    async def run(self, payload: bytes, deliver: Callable[[Result], None], begun: Any = None) -> None:
        def stream(body: bytes) -> None:
            for result in decode_results(body):
                deliver(result)

        rest = await self.process.request(Kind.RUN, payload, stream)
        if rest:  # the results the reply carries (all of a one-op run's)
            stream(rest)

    def cancel(self, requests: list[tuple[int, int]]) -> None:
        self.process.notify(Kind.CANCEL, _msgpack.encode(requests))

    async def call(self, name: str, args: tuple, kwargs: dict, env_ids: list[int] | None = None) -> list[Any]:
        return pickle.loads(await self.process.request(Kind.CALL, pickle.dumps((name, args, kwargs, env_ids))))

    async def set_attr(self, name: str, values: list[Any]) -> None:
        await self.process.request(Kind.SET_ATTR, pickle.dumps((name, values)))

    async def pid(self) -> int:
        """Asks the host itself: a stopped or frozen host does not answer."""
        return _decode_int.decode(await self.process.request(Kind.PID))

    async def close(self, timeout: float) -> None:
        await self.process.close(timeout)

    def kill(self) -> None:
        self.process.kill()


# -- what both drivers of a host process share (this one on the runtime loop, the blocking one of
# a single env on the caller's thread: openenv_gym.hosts.blocking) ------------------------------
def spawn(python: str) -> tuple[subprocess.Popen[bytes], socket.socket, IO[bytes]]:
    """Start ``python -m openenv_gym.hosts.server`` in its own session; returns the process, the
    driver's end of its socketpair and the (unlinked) file its output goes to."""
    if not os.path.exists(python):
        raise ConfigurationError(f"python={python!r}: no such interpreter")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    output = tempfile.TemporaryFile()  # unlinked: only this process and the host see it
    try:
        process = subprocess.Popen(
            [python, "-m", "openenv_gym.hosts.server", "--fd", str(theirs.fileno()), "--parent-pid", str(os.getpid())],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=output, stderr=output,
            env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True,
        )
    except BaseException:
        ours.close()
        output.close()
        raise
    finally:
        theirs.close()
    return process, ours, output


def init_body(init: ShardConfig) -> bytes:
    """The ``INIT`` request: the protocol version, and the config the host builds its shard from."""
    return pickle.dumps((PROTOCOL, init))


def init_failed(python: str, exc: BaseException, timeout: float) -> BaseException:
    """What a failed ``init`` raises: the interpreter cannot run a host (:class:`ConfigurationError`),
    or the host did not answer in time (:class:`HostDied`); anything else (Ctrl-C) as it is."""
    if isinstance(exc, TimeoutError):
        return HostDied(f"the host process under {python} did not answer within {timeout} s")
    if isinstance(exc, HostDied):
        return ConfigurationError(
            f"python={python!r} cannot run the openenv_gym host (is openenv-gym installed in "
            f"that environment? isolate=True builds one that has it): {exc}")
    if isinstance(exc, OpenEnvGymError):  # the host refused (another protocol version)
        return ConfigurationError(f"python={python!r}: {exc}")
    return exc


def output_tail(output: IO[bytes] | None) -> str:
    """The end of what the host printed (its traceback, when it crashed)."""
    if output is None:
        return ""
    try:
        size = output.seek(0, os.SEEK_END)
        start = max(0, size - _STDERR_TAIL)
        output.seek(start)
        text = output.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""
    return whole_lines(text, cut=start > 0)  # never a first line cut mid-word


def gone_message(process: subprocess.Popen[bytes] | None, why: str, output: IO[bytes] | None) -> str:
    """Why a host is gone, with its exit code and the end of its output."""
    code = None if process is None else process.poll()
    if code is not None:
        why = f"it exited with code {code}"
    tail = output_tail(output)
    pid = None if process is None else process.pid
    # The exception that killed it leads (a traceback's last line), then the whole lines.
    return summarize(f"the host process (pid {pid}) is gone: {why}", tail)


def kill_group(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a host's whole process group (its servers too); never raises."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, 9)  # start_new_session: the group is the host and its children
    with contextlib.suppress(ProcessLookupError):
        process.kill()
