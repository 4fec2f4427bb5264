"""The httpx client every HTTP transport of the adapters uses: TCP or a Unix socket, one shared SSL context."""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["make_client", "ssl_context"]


@functools.cache
def ssl_context() -> ssl.SSLContext:
    # Built once per process: each httpx client would otherwise build its own (~10 ms), which
    # dominates starting a vector env of 1,024 sub-envs over 128 clients.
    return ssl.create_default_context()


def make_client(
    url: str,
    *,
    timeout: httpx.Timeout | float,
    headers: dict[str, str] | None = None,
    limits: httpx.Limits | None = None,
    local: bool = False,
) -> httpx.AsyncClient:
    """An httpx client for ``url``: ``http(s)://host[:port]`` or ``unix:<socket path>``.

    ``local`` (a server this process launched) turns off proxies from the environment.
    """
    limits = limits or httpx.Limits()
    if url.startswith("unix:"):
        path = url[len("unix:"):]
        if path.startswith("//"):
            path = path[2:]
        # The shared SSL context: httpx would build one per transport (~1 ms and ~0.8 MiB each,
        # 100 MiB over the 128 clients of 1,024 sub-envs), though a Unix socket never uses TLS.
        transport = httpx.AsyncHTTPTransport(uds=path, limits=limits, verify=ssl_context())
        return httpx.AsyncClient(base_url="http://ors", transport=transport, timeout=timeout, headers=headers,
                                 trust_env=False)
    return httpx.AsyncClient(base_url=url, verify=ssl_context(), timeout=timeout, headers=headers,
                             limits=limits, trust_env=not local)
