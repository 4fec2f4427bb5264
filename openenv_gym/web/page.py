"""One HTML page from the package's static files: styles and scripts inline, data embedded, a CSP.

Both pages are built here, served or written to a file alike: every style and script is inline
(the page opens from disk, and a served page needs no second request), fonts are the system's,
the icon is empty, so opening a page fetches nothing. The Content-Security-Policy enforces it:
only the page's own scripts and styles run (by their hashes, so no inline script that data could
smuggle in does), images only from ``data:`` URLs, and requests only to the page's own server
(``connect-src 'self'``) or, for a file, nowhere.

Data goes in ``<script type="application/json">`` (or ``text/plain``) blocks, which browsers never
run. Every ``<`` in them is written ``\\u003c``, valid in JSON strings, so no text in a record can
close the block (``</script>``) or open a comment: conversations stay text.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
from importlib import resources

__all__ = ["Page", "asset", "json_block_text"]

_STATIC = "static"


@functools.cache
def asset(name: str) -> str:
    """A file of ``openenv_gym/web/static`` as text (a script or style must not hold what would
    end its inline element early, or change how the browser reads it)."""
    text = (resources.files("openenv_gym.web") / _STATIC / name).read_text(encoding="utf-8")
    if not name.endswith(".html") and any(bad in text.lower() for bad in ("</script", "<script", "<!--", "</style")):
        raise AssertionError(f"{name} holds markup that would break out of its inline element")
    return text


def json_block_text(data: bytes) -> bytes:
    """JSON bytes made safe inside a ``<script>`` block (every ``<`` escaped)."""
    return data.replace(b"<", b"\\u003c")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


class Page:
    """A page template (``<!--HEAD-->`` and ``<!--BODY-->`` mark where styles and scripts go)
    with its styles and scripts, each the name of a static file."""

    def __init__(self, template: str, styles: list[str], scripts: list[str], title: str):
        self.template, self.styles, self.scripts, self.title = template, styles, scripts, title

    def csp(self, served: bool) -> str:
        """The page's Content-Security-Policy: its own scripts and styles by hash; requests to its
        server (``served``) or to nothing (a file)."""
        scripts = " ".join(_sha256(asset(s)) for s in self.scripts)
        styles = " ".join(_sha256(asset(s)) for s in self.styles)
        policy = [
            "default-src 'none'", f"script-src {scripts}", f"style-src {styles}", "img-src data:",
            "connect-src 'self'" if served else "connect-src 'none'", "base-uri 'none'", "form-action 'none'",
        ]
        return "; ".join(policy)

    def render(self, blocks: dict[str, tuple[str, bytes]], served: bool) -> bytes:
        """The page, with ``blocks`` (``id -> (type, safe bytes)``; see :func:`json_block_text`)
        embedded before the scripts. A file (``not served``) carries its CSP in a meta tag."""
        head = [f"<title>{html.escape(self.title)}</title>", '<link rel="icon" href="data:,">']
        if not served:
            head.insert(0, f'<meta http-equiv="Content-Security-Policy" content="{html.escape(self.csp(False))}">')
        head += [f"<style>{asset(s)}</style>" for s in self.styles]
        body = b"".join(
            f'<script type="{kind}" id="{name}">'.encode() + data + b"</script>\n" for name, (kind, data) in blocks.items()
        )
        body += "".join(f"<script>{asset(s)}</script>\n" for s in self.scripts).encode()
        top, rest = asset(self.template).split("<!--HEAD-->")
        middle, end = rest.split("<!--BODY-->")
        return top.encode() + "\n".join(head).encode() + middle.encode() + body + end.encode()
