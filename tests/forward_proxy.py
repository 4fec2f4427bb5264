"""A forward HTTP proxy for tests: ``python forward_proxy.py PORT LOG``.

It answers absolute-form requests (``POST http://host:port/path``, what a client sends to a proxy
named by ``HTTP_PROXY``) by making the same request to the target, streaming the answer back (SSE
streams included), and appends one line per request to ``LOG``: the method, the target URL, and
the ``Proxy-Authorization`` and ``Authorization`` headers it carried. It binds 127.0.0.1 only.
"""

from __future__ import annotations

import sys

import aiohttp
from aiohttp import web

HOP = {"connection", "keep-alive", "proxy-authorization", "proxy-connection", "te", "trailers",
       "transfer-encoding", "upgrade", "content-length", "host"}


async def forward(request: web.Request) -> web.StreamResponse:
    client: aiohttp.ClientSession = request.app["client"]
    with open(request.app["log"], "a") as log:
        log.write(f"{request.method} {request.url} proxy-auth={request.headers.get('Proxy-Authorization', '-')} "
                  f"auth={request.headers.get('Authorization', '-')}\n")
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    async with client.request(request.method, str(request.url), headers=headers, data=await request.read(),
                              allow_redirects=False) as upstream:
        response = web.StreamResponse(status=upstream.status, headers={
            k: v for k, v in upstream.headers.items() if k.lower() not in HOP})
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def make_app(log: str) -> web.Application:
    app = web.Application()
    app["log"] = log

    async def client_context(app: web.Application):
        app["client"] = aiohttp.ClientSession(auto_decompress=False)
        yield
        await app["client"].close()

    app.cleanup_ctx.append(client_context)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


if __name__ == "__main__":
    web.run_app(make_app(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), print=None)
