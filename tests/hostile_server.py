"""A server that misbehaves on purpose, one mode per behaviour (run as a script by the tests).

It speaks just enough ORS (under ``/hostile``) and OpenEnv (under ``/openenv``, ``/openenv-huge``)
for ``gym.make`` to start, then misbehaves when asked. The mode comes from the action, so one
server serves a whole vector env whose sub-envs each misbehave differently:

* ORS: the tool ``act(how)``; the opening by task index (:data:`PROMPTS`).
* OpenEnv: a typed action ``{"how": ...}``; the opening by seed (:data:`OBSERVATIONS`).

``GET /sent`` answers how many bytes the endless and huge modes have written so far, so a test can
check what a client read before it hung up. It listens on a Unix socket (``--unix PATH``) or on
127.0.0.1 (``--port 0``), or both, and prints each address on a line of stdout once it listens
(OpenEnv's modes need TCP: its WebSocket URL keeps the ``/openenv`` prefix only there).

    python tests/hostile_server.py --unix /tmp/x/hostile.sock --port 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import uuid

from aiohttp import WSMsgType, web

CHUNK = "x" * 65536
HOWS = ("ok", "end_then_ping", "end_then_silence", "endless_chunks", "huge_result", "deep_result",
        "deep_500", "html", "bad_utf8")
PROMPTS = {0: "ok", 1: "huge_prompt", 2: "deep_prompt"}
OBSERVATIONS = {0: "ok", 1: "deep", 2: "huge"}
sent = 0
sessions: dict[str, int] = {}


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def result(text: str, metadata: str = "null") -> str:
    return ('{"ok":true,"output":{"blocks":[{"type":"text","text":' + json.dumps(text) + '}],"metadata":'
            + metadata + ',"reward":1.0,"finished":false}}')


async def sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await response.prepare(request)
    return response


async def write(response: web.StreamResponse, data: bytes) -> None:
    global sent
    await response.write(data)
    sent += len(data)


async def huge_json(request: web.Request, head: bytes, megabytes: int, tail: bytes) -> web.StreamResponse:
    """A JSON document of ``megabytes`` MB, chunked (no Content-Length for a client to go by)."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await write(response, head)
    for _ in range(megabytes * 1024 * 1024 // len(CHUNK)):
        await write(response, CHUNK.encode())
    await write(response, tail)
    return response


# -- ORS ----------------------------------------------------------------------------------------------
async def call(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    how = body.get("input", {}).get("how", "ok")
    if how == "html":
        return web.Response(text="<html><body>502 Bad Gateway</body></html>", content_type="text/html")
    response = await sse(request)
    await response.write(f"event: task_id\r\ndata: {uuid.uuid4().hex}\r\n\r\n".encode())
    if how in ("endless_chunks", "huge_result"):
        total = 0
        while how == "endless_chunks" or total < 100 * 1024 * 1024:
            await write(response, f"event: chunk\r\ndata: {CHUNK}\r\n\r\n".encode())
            total += len(CHUNK)
    if how == "deep_result":
        await response.write(f"event: end\r\ndata: {result('deep', deep(100_000))}\r\n\r\n".encode())
    elif how == "deep_500":
        await response.write(f"event: end\r\ndata: {result('deep', deep(500))}\r\n\r\n".encode())
    elif how == "bad_utf8":
        await response.write(b'event: end\r\ndata: {"ok":true,"output":{"blocks":[{"text":"\xff\xfe"}]}}\r\n\r\n')
    else:
        await response.write(f"event: end\r\ndata: {result('fine ' + how)}\r\n\r\n".encode())
    if how == "end_then_ping":
        while True:
            await response.write(b": ping\r\n\r\n")
            await asyncio.sleep(0.05)
    if how == "end_then_silence":
        await asyncio.sleep(3600)
    return response


async def prompt(request: web.Request) -> web.StreamResponse:
    mode = PROMPTS.get(sessions.get(request.headers.get("X-Session-ID", ""), 0), "ok")
    if mode == "deep_prompt":
        return web.Response(text=deep(100_000), content_type="application/json")
    if mode == "huge_prompt":
        return await huge_json(request, b'[{"type":"text","text":"', 200, b'"}]')
    return web.json_response([{"type": "text", "text": "Call act(how) to misbehave."}])


async def create(request: web.Request) -> web.Response:
    body = await request.json()
    sid = request.headers["X-Session-ID"]
    sessions[sid] = int(body.get("index") or 0)
    return web.json_response({"sid": sid})


TOOLS = {"tools": [{"name": "act", "description": "Misbehave as told.",
                    "input_schema": {"type": "object", "properties": {"how": {"type": "string", "enum": list(HOWS)}},
                                     "required": ["how"]}}]}


def ors_routes(app: web.Application) -> None:
    app.router.add_get("/health", lambda r: web.json_response({"status": "ok"}))
    app.router.add_get("/sent", lambda r: web.json_response({"sent": sent}))
    app.router.add_get("/list_environments", lambda r: web.json_response(["hostile"]))
    app.router.add_get("/hostile/tools", lambda r: web.json_response(TOOLS))
    app.router.add_get("/hostile/task_tools", lambda r: web.json_response(TOOLS))
    app.router.add_get("/hostile/splits", lambda r: web.json_response([{"name": "train", "type": "train"}]))
    app.router.add_post("/hostile/num_tasks", lambda r: web.json_response({"num_tasks": len(PROMPTS)}))
    app.router.add_post("/hostile/task", lambda r: web.json_response({"task": {}}))
    app.router.add_post("/create", create)
    app.router.add_get("/hostile/prompt", prompt)
    app.router.add_post("/hostile/call", call)
    app.router.add_post("/ping", lambda r: web.json_response({"status": "ok"}))
    app.router.add_post("/delete", lambda r: web.json_response({"sid": r.headers.get("X-Session-ID")}))


# -- OpenEnv --------------------------------------------------------------------------------------------
SCHEMA = {"action": {"type": "object", "properties": {"how": {"type": "string"}}, "required": ["how"]},
          "observation": {"type": "object"}}


def observation(message: str, payload: str = '""') -> str:
    return ('{"type":"observation","data":{"observation":{"message":' + json.dumps(message) + ',"payload":'
            + payload + '},"reward":1.0,"done":false}}')


async def ws(request: web.Request) -> web.WebSocketResponse:
    sock = web.WebSocketResponse(max_msg_size=0)
    await sock.prepare(request)
    step = 0
    async for msg in sock:
        if msg.type != WSMsgType.TEXT:
            break
        message = json.loads(msg.data)
        kind, data = message.get("type"), message.get("data") or {}
        if kind == "close":
            break
        if kind == "reset":
            step = 0
            mode = OBSERVATIONS.get(int(data.get("seed") or 0), "ok")
        else:
            step += 1
            mode = data.get("how", "ok")
        if mode == "unknown_type":
            await sock.send_str('{"type":"telemetry","data":{"cpu":0.5}}')
        elif mode == "twice":
            await sock.send_str(observation(f"reply A to step {step}"))
            await sock.send_str(observation(f"reply B to step {step}"))
        elif mode == "huge":
            await sock.send_str(observation("huge", json.dumps("x" * (40 * 1024 * 1024))))
        elif mode == "deep":
            await sock.send_str(observation("deep", deep(100_000)))
        elif mode == "deep_500":
            await sock.send_str(observation("deep", deep(500)))
        elif mode == "bad_utf8":
            await sock.send_bytes(b'{"type":"observation","data":{"observation":{"message":"\xff\xfe"}}}')
        else:
            await sock.send_str(observation(f"fine {mode} {step}"))
    return sock


async def huge_schema(request: web.Request) -> web.StreamResponse:
    return await huge_json(request, b'{"action":{"description":"', 100, b'"}}')


def openenv_routes(app: web.Application) -> None:
    for prefix in ("/openenv", "/openenv-huge"):
        app.router.add_get(f"{prefix}/health", lambda r: web.json_response({"status": "healthy"}))
        app.router.add_get(f"{prefix}/metadata", lambda r: web.json_response({"name": "hostile"}))
        app.router.add_get(f"{prefix}/ws", ws)
    app.router.add_get("/openenv/schema", lambda r: web.json_response(SCHEMA))
    app.router.add_get("/openenv-huge/schema", huge_schema)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unix")
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # clients hanging up mid-stream is the point
    app = web.Application()
    ors_routes(app)
    openenv_routes(app)
    runner = web.AppRunner(app, handle_signals=True)
    await runner.setup()
    if args.unix:
        await web.UnixSite(runner, args.unix).start()
        os.chmod(args.unix, 0o600)
        print(f"unix:{args.unix}", flush=True)
    if args.port is not None:
        await web.TCPSite(runner, "127.0.0.1", args.port).start()
        host, port = next(a for a in runner.addresses if isinstance(a, tuple))[:2]
        print(f"http://{host}:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
