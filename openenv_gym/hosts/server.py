"""The adapter host process: ``python -m openenv_gym.hosts.server --fd N --parent-pid P``.

Started by :class:`~openenv_gym.hosts.process.HostProcess` under the interpreter the env needs
(``python=``, or the venv ``isolate=True`` built). It serves one
:class:`~openenv_gym.shard.shard.Shard` over the inherited socket ``N``
(:mod:`openenv_gym.hosts.protocol`): an ``INIT`` frame builds it, then each frame calls one of its
methods, concurrently, through a table of the closed set of requests. A ``RUN``'s results go back
as they finish, gathered per loop iteration, so the driver sees the first-ready order across
processes.

It ends when the driver says ``bye``, when the socket closes (the driver exited or closed it), or
when the driver dies (``PR_SET_PDEATHSIG``); each way its env's episodes and servers are closed
first, within a bound.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import pickle
import signal
import socket
import sys

import msgspec

from openenv_gym.hosts.protocol import PROTOCOL, Frame, Kind, read_frame, write_frame
from openenv_gym.processes import die_with_parent
from openenv_gym.shard.ops import Result, decode_ops, encode_results, error_dict
from openenv_gym.shard.shard import Shard

_CLOSE_TIMEOUT = 30.0
_msgpack = msgspec.msgpack.Encoder()
_requests = msgspec.msgpack.Decoder(list[tuple[int, int]])


class _Server:
    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer
        self.host: Shard | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.pending: dict[int, list[Result]] = {}  # run id -> results not yet sent
        self.flush_scheduled = False
        self.done = asyncio.Event()

    # -- results, gathered per loop iteration ----------------------------------------------------
    def emit(self, call_id: int, result: Result) -> None:
        self.pending.setdefault(call_id, []).append(result)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        for call_id in list(self.pending):
            if results := self.pending.pop(call_id, None):
                write_frame(self.writer, Frame(call_id, Kind.RESULTS, encode_results(results)))

    # -- requests --------------------------------------------------------------------------------
    def dispatch(self, frame: Frame) -> None:
        if frame.kind is Kind.BYE:
            self.done.set()
            return
        task = asyncio.get_running_loop().create_task(self.answer(frame))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def answer(self, frame: Frame) -> None:
        try:
            body = await self.perform(frame)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the host's code failed: the driver raises it, typed
            if frame.id:
                write_frame(self.writer, Frame(frame.id, Kind.ERROR, error=error_dict(exc)))
            return
        if frame.id:
            write_frame(self.writer, Frame(frame.id, Kind.REPLY, body))
        try:
            await self.writer.drain()
        except ConnectionError:
            self.done.set()

    async def perform(self, frame: Frame) -> bytes:
        if frame.kind is Kind.INIT:
            return self.init(frame.body)
        method = _METHODS.get(frame.kind)
        if method is None:
            raise RuntimeError(f"{frame.kind!r} is not a request; the host answers "
                               f"{', '.join(k.name for k in (Kind.INIT, *_METHODS))}")
        if self.host is None:
            raise RuntimeError(f"{frame.kind.name} before INIT")
        return await method(self, self.host, frame)

    def init(self, body: bytes) -> bytes:
        protocol, config = pickle.loads(body)
        if protocol != PROTOCOL:
            raise RuntimeError(f"the driver speaks another host protocol ({protocol}) than this host ({PROTOCOL}); "
                               "the interpreter has another version of openenv_gym installed")
        self.host = Shard(config)
        from openenv_gym.version import __version__

        return _msgpack.encode({"protocol": PROTOCOL, "version": __version__, "python": sys.version})

    async def run(self, host: Shard, frame: Frame) -> bytes:
        ops = decode_ops(frame.body)
        if len(ops) == 1:  # nothing to order: its result rides in the reply (one frame, one wake-up)
            results: list[Result] = []
            await host.submit(ops, results.append)
        else:
            await host.submit(ops, functools.partial(self.emit, frame.id))
            results = self.pending.pop(frame.id, [])  # what the reply carries: none streamed yet
        return encode_results(results) if results else b""

    async def start(self, host: Shard, frame: Frame) -> bytes:
        return await host.start_encoded()

    async def cancel(self, host: Shard, frame: Frame) -> bytes:
        await host.cancel(_requests.decode(frame.body))  # already a list of (env_id, req_id) tuples
        return b""

    async def call(self, host: Shard, frame: Frame) -> bytes:
        name, args, kwargs, env_ids = pickle.loads(frame.body)
        return pickle.dumps(await host.call(name, args, kwargs, env_ids))

    async def set_attr(self, host: Shard, frame: Frame) -> bytes:
        name, values = pickle.loads(frame.body)
        await host.set_attr(name, values)
        return b""

    async def pid(self, host: Shard, frame: Frame) -> bytes:
        return _msgpack.encode(await host.pid())

    async def close(self, host: Shard, frame: Frame) -> bytes:
        await host.close()
        return b""

    async def shutdown(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.host is not None:
            try:
                async with asyncio.timeout(_CLOSE_TIMEOUT):
                    await self.host.close()
            except BaseException:
                pass


_METHODS = {
    Kind.RUN: _Server.run, Kind.START: _Server.start, Kind.CANCEL: _Server.cancel, Kind.CALL: _Server.call,
    Kind.SET_ATTR: _Server.set_attr, Kind.PID: _Server.pid, Kind.CLOSE: _Server.close,
}
"""The requests a host answers once built, and the method answering each."""


async def serve(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
    server = _Server(writer)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, server.done.set)

    async def pump() -> None:
        try:
            while (frame := await read_frame(reader)) is not None:
                server.dispatch(frame)
        except (ValueError, ConnectionError):
            pass
        server.done.set()

    reading = loop.create_task(pump())
    await server.done.wait()
    reading.cancel()
    await server.shutdown()
    try:
        writer.close()
    except Exception:
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent(args.parent_pid)
    # The terminal's Ctrl-C is the trainer's to handle (this process has its own session anyway).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # the faster loop where the host's venv has it (the ors and openenv extras bring it)
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(args.fd))


if __name__ == "__main__":
    main()
