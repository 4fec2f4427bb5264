"""A loopback TCP proxy that injects the network faults ORS clients must survive.

It forwards bytes between a client and an upstream server on 127.0.0.1 and, when armed:
* cuts the response of the next ``/call`` right after its ``task_id`` event (a dropped stream);
* answers the next ``POST /create`` with ``503`` + ``Retry-After`` (a server still starting).
It runs its own event loop in a thread and stops with :meth:`close`.
"""

from __future__ import annotations

import asyncio
import threading


class FaultProxy:
    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.cut_calls = 0
        self.fail_creates = 0
        self.creates_refused = 0
        self.calls_cut = 0
        self.requests: list[str] = []  # "METHOD /path" of every request seen
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        state = {"cut_next_call": False}

        def close_all() -> None:
            for w in (client_w, up_w):
                w.close()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                head = data.split(b"\r\n", 1)[0].split(b" ")
                if len(head) == 3 and head[2].startswith(b"HTTP/"):
                    self.requests.append(f"{head[0].decode()} {head[1].decode()}")
                if self.fail_creates and data.startswith(b"POST /create"):
                    self.fail_creates -= 1
                    self.creates_refused += 1
                    body = b'{"detail":"Environment still starting."}'
                    client_w.write(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 0.2\r\n"
                                   b"X-Backend-State: starting\r\ncontent-type: application/json\r\n"
                                   b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                    await client_w.drain()
                    close_all()
                    return
                if self.cut_calls and b"/call " in data.split(b"\r\n", 1)[0]:
                    self.cut_calls -= 1
                    state["cut_next_call"] = True
                up_w.write(data)
                await up_w.drain()
            up_w.close()

        async def downstream() -> None:
            buffer = b""
            while data := await up_r.read(65536):
                if state["cut_next_call"]:
                    buffer += data
                    mark = buffer.find(b"event: task_id")
                    end = buffer.find(b"\r\n\r\n", mark) if mark >= 0 else -1
                    if end < 0:
                        continue
                    client_w.write(buffer[: end + 4])
                    await client_w.drain()
                    self.calls_cut += 1
                    close_all()
                    return
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        try:
            await asyncio.gather(upstream(), downstream())
        except (ConnectionError, OSError):
            close_all()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
