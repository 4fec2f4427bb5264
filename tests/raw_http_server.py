"""A server that writes raw bytes: it answers ``POST /<mode>/call`` as ``<mode>`` says, right or wrong.

Run as ``python raw_http_server.py``; prints ``http://127.0.0.1:<port>`` once listening. Every
answer names the connection it came on (``conn <n>``), so a test can tell a reused connection
from a new one. Modes (the path's first part):

* ``ok``: a chunked SSE stream ending in its ``end`` event; the connection stays open.
* ``slowok``: ``ok`` after 0.2 s (for tests that need calls to overlap).
* ``eofbody``: the SSE stream without a length or chunking, ended by closing the connection.
* ``closeafter``: ``ok``, then the server closes the idle connection 0.1 s later.
* ``twice``: ``ok`` followed by a second response nobody asked for.
* ``lateend``: the stream's result at once, its end (the last chunk) 0.3 s later, as a busy
  server writes it.
* ``noend``: the stream's result, then nothing: the response never ends.
* ``moreafter``: the stream's result, then 0.1 s later more of the body (a ping) and the end.
* ``garbage``: bytes that are not HTTP.
* ``bighead``: a response whose headers go on for 100 KiB.
* ``cut``: the response's headers and part of its body, then the connection closes.
* ``hang``: the headers, then nothing.
* ``raw``: the request's JSON ``input.raw`` (latin-1 text) as the whole answer, then close.
"""

from __future__ import annotations

import asyncio
import json
import sys

accepted = 0


def sse(conn: int) -> bytes:
    result = json.dumps({"ok": True, "output": {"blocks": [{"type": "text", "text": f"conn {conn}"}],
                                                 "reward": 1.0, "finished": False}})
    return f"event: task_id\ndata: t1\n\nevent: end\ndata: {result}\n\n".encode()


def chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    global accepted
    accepted += 1
    conn = accepted
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            _, path, _ = lines[0].split(" ")
            length = next((int(v) for k, _, v in (line.partition(": ") for line in lines[1:])
                           if k.lower() == "content-length"), 0)
            body = await reader.readexactly(length)
            mode = path.split("/")[1]
            if mode == "slowok":
                await asyncio.sleep(0.2)
            if mode in ("ok", "slowok", "closeafter", "twice"):
                writer.write(HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunked(sse(conn)))
                if mode == "twice":
                    writer.write(HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunked(b"event: end\ndata: stray\n\n"))
                if mode == "closeafter":
                    await writer.drain()
                    await asyncio.sleep(0.1)
                    return
                continue
            if mode in ("lateend", "noend", "moreafter"):
                body = sse(conn)
                writer.write(HEAD + b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(body), body))
                await writer.drain()
                if mode == "noend":
                    await asyncio.sleep(3600)
                await asyncio.sleep(0.3 if mode == "lateend" else 0.1)
                writer.write(b"0\r\n\r\n" if mode == "lateend" else chunked(b": ping\n\n"))
                continue
            if mode == "eofbody":
                writer.write(HEAD + b"connection: close\r\n\r\n" + sse(conn))
            elif mode == "garbage":
                writer.write(b"this is not HTTP at all\r\n\r\n")
            elif mode == "bighead":
                writer.write(HEAD + b"".join(b"x-filler-%d: %s\r\n" % (i, b"y" * 100) for i in range(1000)) + b"\r\n")
            elif mode == "cut":
                writer.write(HEAD + b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\nevent: ping\n\n" % 13)
            elif mode == "hang":
                writer.write(HEAD + b"transfer-encoding: chunked\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(3600)
            elif mode == "raw":
                writer.write(json.loads(body)["input"]["raw"].encode("latin-1"))
            await writer.drain()
            return
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main() -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
