"""``openenv-gym view``: the episodes of rollout and RecordEpisodes files, in a page.

The page is the same whether it is served or written to one file (``--html``): the list columns,
the summary and the notes are embedded in it; what differs is where an opened episode and a text
search come from. Served, the browser asks this server (``/api/episode/N``, ``/api/search?q=``),
so a page over 100,000 episodes carries only their list (a few MB) and the records stay here. In
a file, every record and every episode's search text are embedded too (tool lists once each), so
the file opens from disk with no server; it is about as large as the files it shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

import msgspec
from aiohttp import web

from openenv_gym.errors import ConfigurationError
from openenv_gym.web.access import Access
from openenv_gym.web.page import Page, json_block_text
from openenv_gym.web.rollouts import Rollouts, expand, load, printable
from openenv_gym.web.serving import LoopbackServer, run
from openenv_gym.web.summary import summarize

__all__ = ["VIEW_PAGE", "MAX_HTML_BYTES", "index", "render_file", "write_html", "make_app", "view_server", "view_command"]

MAX_HTML_BYTES = 128 * 2**20
"""The largest page ``view --html`` writes: a browser holds the whole file in memory at once (five
10 MB records made a 786 MB page that never painted). Bigger runs are served (``view FILE``), which
reads an episode when it is opened."""

VIEW_PAGE = Page("view.html", styles=["style.css"], scripts=["chat.js", "view.js"], title="openenv-gym view")

_encode = msgspec.json.encode


def index(rollouts: Rollouts, mode: str, title: str = "") -> dict[str, Any]:
    """What every view page embeds: the list columns, the files and envs they index, the summary,
    the notes on skipped lines, and ``mode`` (``"served"`` or ``"file"``)."""
    return {
        "mode": mode, "title": title, "files": rollouts.files, "envs": rollouts.envs,
        "columns": rollouts.columns, "summary": summarize(rollouts),
        "notes": rollouts.notes, "skipped": rollouts.skipped,
    }


def episode_json(rollouts: Rollouts, i: int) -> bytes:
    """Episode ``i`` for the page: ``{"record": ..., "where": "file:line"}``, or ``{"error": ...}``
    saying why its record does not decode."""
    try:
        record = rollouts.record(i)
    except msgspec.DecodeError as exc:
        return _encode({"error": f"{rollouts.where(i)}: this record does not decode: {exc}", "where": rollouts.where(i)})
    return _encode({"record": record, "where": rollouts.where(i)})


def _file_blocks(rollouts: Rollouts) -> tuple[list[Any], bytes, bytes]:
    """Every episode's record (tool lists by reference) and search text, one JSON line each."""
    tools: list[Any] = []
    tool_refs: dict[bytes, int] = {}
    records: list[bytes] = []
    for i in range(len(rollouts)):
        try:
            record = rollouts.record(i)
        except msgspec.DecodeError as exc:
            records.append(_encode({"error": f"{rollouts.where(i)}: this record does not decode: {exc}",
                                    "where": rollouts.where(i)}))
            continue
        ref = None
        if record.tools is not None:
            key = _encode(record.tools)
            ref = tool_refs.get(key)
            if ref is None:
                ref = tool_refs[key] = len(tools)
                tools.append(record.tools)
            record = msgspec.structs.replace(record, tools=None)
        records.append(b'{"tools":%s,"where":%s,"record":%s}' % (
            b"null" if ref is None else str(ref).encode(), _encode(rollouts.where(i)), _encode(record)))
    texts = b"\n".join(_encode(t) for t in rollouts.texts)
    return tools, b"\n".join(records), texts


def render_file(rollouts: Rollouts, title: str = "") -> bytes:
    """The self-contained page of ``rollouts``: opens from disk, fetches nothing."""
    tools, records, texts = _file_blocks(rollouts)
    data = index(rollouts, "file", title)
    data["tools"] = tools
    blocks = {
        "og-index": ("application/json", json_block_text(_encode(data))),
        "og-records": ("text/plain", json_block_text(records)),
        "og-texts": ("text/plain", json_block_text(texts)),
    }
    return VIEW_PAGE.render(blocks, served=False)


def write_html(paths: Iterable[str | os.PathLike[str]], out: str | os.PathLike[str]) -> Rollouts:
    """Write the self-contained page of the episodes in ``paths`` to ``out``; returns what was read."""
    paths = list(paths)
    target = Path(out)
    if target.is_dir():
        raise ConfigurationError(f"cannot write the page to {target}: it is a directory; give a file's path")
    if not target.parent.is_dir():
        raise ConfigurationError(f"cannot write the page to {target}: its folder {target.parent} does not exist")
    records = sum(p.stat().st_size for p in expand(paths))
    if records > MAX_HTML_BYTES:  # the page holds every record and more: refused before it is built
        raise ConfigurationError(_too_big(records))
    rollouts = load(paths)
    if not len(rollouts):
        raise ConfigurationError(f"no episode records in {', '.join(printable(str(p)) for p in paths)}: nothing to show" + _why(rollouts))
    data = render_file(rollouts, title=_title(paths))
    if len(data) > MAX_HTML_BYTES:
        raise ConfigurationError(_too_big(len(data)))
    # A fresh name of our own beside the target (never a guessable one a link could sit at), born
    # 0600: the page holds the runs' model text; replaced in one step, so a reader never opens half a page.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return rollouts


def _too_big(size: int) -> str:
    return (f"the page would hold {size:,} bytes, over MAX_HTML_BYTES={MAX_HTML_BYTES:,}, more than a "
            "browser opens at once: serve it instead (openenv-gym view FILE, without --html), which reads each episode when "
            "it is opened")


def _why(rollouts: Rollouts) -> str:
    """The first reasons lines were skipped, for an error that found nothing to show."""
    return f" ({rollouts.skipped} line(s) skipped: {'; '.join(rollouts.notes[:3])})" if rollouts.skipped else ""


def _episodes(n: int) -> str:
    return f"{n:,} episode" + ("" if n == 1 else "s")


def _title(paths: Sequence[str | os.PathLike[str]]) -> str:
    names = [printable(Path(p).name) for p in paths]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def make_app(rollouts: Rollouts, title: str = "") -> web.Application:
    """The view's routes: the page (``/``), one episode (``/api/episode/N``), a text search
    (``/api/search?q=``). Access control is added by :class:`~openenv_gym.web.serving.LoopbackServer`."""
    page = VIEW_PAGE.render({"og-index": ("application/json", json_block_text(_encode(index(rollouts, "served", title))))},
                            served=True)
    csp = VIEW_PAGE.csp(served=True) + "; frame-ancestors 'none'"

    async def get_page(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8",
                            headers={"Content-Security-Policy": csp})

    async def get_episode(request: web.Request) -> web.Response:
        try:
            i = int(request.match_info["n"])
        except ValueError:
            i = -1
        if not 0 <= i < len(rollouts):
            return web.json_response({"error": f"no episode {request.match_info['n']!r}"}, status=404)
        return web.Response(body=episode_json(rollouts, i), content_type="application/json")

    async def get_search(request: web.Request) -> web.Response:
        query = request.query.get("q", "")
        # A first search that comes before the background build waits for it (about a second at
        # 100,000 episodes): off the loop.
        matches = await asyncio.to_thread(rollouts.search, query)
        return web.Response(body=_encode({"query": query, "matches": matches}), content_type="application/json")

    async def on_startup(app: web.Application) -> None:
        rollouts.prepare_search()

    app = web.Application()
    app.on_startup.append(on_startup)
    app.router.add_get("/", get_page)
    app.router.add_get("/api/episode/{n}", get_episode)
    app.router.add_get("/api/search", get_search)
    return app


def view_server(paths: Iterable[str | os.PathLike[str]], port: int = 0) -> tuple[LoopbackServer, Rollouts]:
    """A server of the view page over the episodes in ``paths`` (not started: see
    :func:`~openenv_gym.web.serving.run`)."""
    paths = list(paths)
    rollouts = load(paths)
    if not len(rollouts):
        raise ConfigurationError(f"no episode records in {', '.join(printable(str(p)) for p in paths)}: nothing to show" + _why(rollouts))
    return LoopbackServer(make_app(rollouts, _title(paths)), Access(), port), rollouts



def view_command(paths: Sequence[str], html: str | None = None, port: int = 0, out: TextIO | None = None) -> int:
    """``openenv-gym view FILE... [--html OUT] [--port N]``: write the page, or serve it until Ctrl-C."""
    out = out or sys.stdout
    if html is not None:
        rollouts = write_html(paths, html)
        _report(rollouts, out)
        print(f"wrote {_episodes(len(rollouts))} to {printable(str(html))} (one self-contained file: open it in a browser)",
              file=out)
        return 0
    server, rollouts = view_server(paths, port)
    _report(rollouts, out)
    print(f"{_episodes(len(rollouts))} from {', '.join(rollouts.files)}", file=out, flush=True)
    return run(server, "view", out)


def _report(rollouts: Rollouts, out: TextIO) -> None:
    """The notes on skipped lines, on the terminal too (the page shows them at the top)."""
    if rollouts.skipped:
        print(f"skipped {rollouts.skipped} line(s):", file=out)
        for note in rollouts.notes[:5]:
            print(f"  {note}", file=out)
        if rollouts.skipped > 5:
            print(f"  ... (the page lists up to {len(rollouts.notes)})", file=out)
