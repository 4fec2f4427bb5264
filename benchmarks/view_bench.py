"""How ``openenv-gym view`` copes with 100,000 episodes: loading, the page, scrolling, sorting, searching.

The episodes are real: a grouped rollout of the bundled Arithmetic env played by the bundled
OpenAI-compatible stub (half the submissions wrong; ``--tokens`` adds token ids and logprobs),
tiled to the sizes measured with each copy's groups renumbered (about 1.7 KB an episode).
The page runs in headless Chromium (Debian's ``chromium``, driven by playwright), as a user's
browser would run it, with the page's CSP on. Each repeat measures, for the large size and for
a small baseline in the same run:

* reading the files, server side (``web.rollouts.load``), against reading the same file with
  ``openenv_gym.records.read_records`` (every record decoded whole);
* the served page: from navigation to the list drawn (``body[data-ready]``);
* scrolling: the list scrolled by 40 rows per animation frame for three seconds: the interval
  between frames, the time to draw each new position (the page's script, style and layout), and
  the rows the page holds in its DOM;
* sorting by reward, filtering by reward, and a text search (the first one, which builds the
  search texts unless the server already has, and the next);
* the written file (``--html``): from navigation to the list drawn.

    python benchmarks/view_bench.py [--episodes 100000] [--baseline 1000] [--reps 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure, write  # noqa: E402

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions"]

SCROLL = """async () => {
  const list = document.querySelector('#list');
  const frames = [], draws = [];
  let last = performance.now();
  const end = last + 3000;
  await new Promise((done) => {
    function step(now) {
      frames.push(now - last);
      last = now;
      const t0 = performance.now();
      list.scrollTop = (list.scrollTop + 40 * 26) % (list.scrollHeight - list.clientHeight);
      OG.viewState.draw();
      void list.offsetHeight;  // style and layout of the rows drawn, in the measured time
      draws.push(performance.now() - t0);
      if (now < end) requestAnimationFrame(step); else done();
    }
    requestAnimationFrame(step);
  });
  frames.shift();
  const q = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(s.length * p))]; };
  return {frame_median: q(frames, 0.5), frame_p95: q(frames, 0.95), draw_median: q(draws, 0.5), draw_p95: q(draws, 0.95),
          rows: document.querySelectorAll('#list .row').length};
}"""


def make_rollout(path: Path, tokens: bool) -> list[bytes]:
    """A real grouped rollout (256 episodes, groups of 8); its lines."""

    import openenv_gym  # noqa: F401
    from openenv_gym.policies import OpenAIPolicy
    from openenv_gym.rollout import collect
    from openenv_gym.testing.openai_stub import OpenAIStub, sometimes_wrong

    with OpenAIStub(sometimes_wrong()) as stub:
        policy = OpenAIPolicy(stub.url, "stub", token_ids=tokens)
        try:
            collect("openenv/Arithmetic-v0", 256, num_envs=32, group_size=8, policy=policy, out=path, progress=False)
        finally:
            policy.close()
    return path.read_bytes().splitlines()


def tile(lines: list[bytes], n: int, path: Path) -> None:
    """``n`` episodes from ``lines``, each copy's groups renumbered so groups stay groups."""
    records = [json.loads(line) for line in lines]
    top = 1 + max(r.get("group") or 0 for r in records)
    with open(path, "w") as fh:
        for k in range(n):
            record = dict(records[k % len(records)])
            record["group"] = record["group"] + top * (k // len(records))
            fh.write(json.dumps(record, separators=(",", ":")) + "\n")


class Served:
    """A view server on a thread of its own (as the command runs it)."""

    def __init__(self, path: Path):
        from openenv_gym.web.serving import run
        from openenv_gym.web.view import view_server

        self.server, self.rollouts = view_server([path])
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

        async def ready(url: str) -> None:
            self._loop, self.url = asyncio.get_running_loop(), url
            self._ready.set()

        self.thread = threading.Thread(target=run, args=(self.server, "bench", open(os.devnull, "w"), ready), daemon=True)
        self.thread.start()
        self._ready.wait(120)

    def stop(self) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.server.stopping.set)
        self.thread.join(60)


def until(page: Any, expression: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not page.evaluate(f"() => Boolean({expression})"):
        if time.monotonic() > deadline:
            raise TimeoutError(expression)
        time.sleep(0.01)


def measure_page(browser: Any, url: str, search: bool) -> dict[str, float]:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        start = time.perf_counter()
        page.goto(url, timeout=300_000)
        page.wait_for_selector("body[data-ready='1']", timeout=300_000)
        out: dict[str, float] = {"ready": time.perf_counter() - start}
        if not search:
            return out
        scroll = page.evaluate(SCROLL)
        out.update(frame_median=scroll["frame_median"], frame_p95=scroll["frame_p95"],
                   draw_median=scroll["draw_median"], draw_p95=scroll["draw_p95"], dom_rows=scroll["rows"])
        start = time.perf_counter()
        page.click("#list-head [data-key=reward]")
        until(page, "document.querySelector('#list-head [data-key=reward]').classList.contains('sorted')")
        out["sort"] = time.perf_counter() - start
        start = time.perf_counter()
        page.fill("#f-min", "1")
        until(page, "document.querySelector('#count').textContent.includes(' of ')")
        out["filter"] = time.perf_counter() - start
        page.fill("#f-min", "")
        for key in ("search_first", "search_next"):
            page.fill("#f-text", "")
            until(page, "!document.querySelector('#count').textContent.includes(' of ')")
            start = time.perf_counter()
            page.fill("#f-text", "incorrect" if key == "search_first" else "correct!")
            until(page, "document.querySelector('#count').textContent.includes(' of ')")
            out[key] = time.perf_counter() - start - 0.2  # less the page's 200 ms typing pause
        return out
    finally:
        page.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--baseline", type=int, default=1_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-html", action="store_true", help="skip the written file's figure")
    parser.add_argument("--tokens", action="store_true",
                        help="record token ids and logprobs (the stub's ids are bytes: 4.5 KB an episode, not 1.7)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from openenv_gym.records import read_records
    from openenv_gym.web.rollouts import load
    from openenv_gym.web.view import write_html

    chromium = os.environ.get("OPENENV_GYM_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    big_n, small_n = args.episodes, args.baseline
    results: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        print("collecting a real rollout to tile ...", flush=True)
        lines = make_rollout(tmpdir / "seed.jsonl", args.tokens)
        big, small = tmpdir / "big.jsonl", tmpdir / "small.jsonl"
        tile(lines, big_n, big)
        tile(lines, small_n, small)
        print(f"{big_n:,} episodes: {big.stat().st_size / 2**20:.0f} MiB", flush=True)
        html = tmpdir / "big.html"
        if not args.no_html:
            start = time.perf_counter()
            write_html([big], html)
            print(f"--html: {html.stat().st_size / 2**20:.0f} MiB written in {time.perf_counter() - start:.1f} s",
                  flush=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=FLAGS)
            try:
                for rep in range(args.reps):
                    for name, path in (("small", small), ("big", big)):  # alternate sides
                        start = time.perf_counter()
                        load([path])
                        add(f"load_{name}", time.perf_counter() - start)
                    start = time.perf_counter()
                    read_records(big)
                    add("read_records_big", time.perf_counter() - start)
                    for name, path in (("small", small), ("big", big)):
                        served = Served(path)
                        try:
                            for key, value in measure_page(browser, served.url, search=True).items():
                                add(f"{key}_{name}", value)
                        finally:
                            served.stop()
                    if not args.no_html:
                        add("html_ready_big", measure_page(browser, html.as_uri(), search=False)["ready"])
                    print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.3g}" for k, v in sorted(results.items())),
                          flush=True)
            finally:
                browser.close()

    r = results
    ratio = lambda a, b: [x / y for x, y in zip(r[a], r[b])]  # noqa: E731
    big_s, small_s = f"{big_n:,}", f"{small_n:,}"
    figures = [
        figure(f"view: page ready, {big_s} episodes (served), s", r["ready_big"], unit="s", target=5.0,
               higher_is_better=False),
        figure(f"view: page ready, {big_s} vs {small_s} episodes", ratio("ready_big", "ready_small"),
               higher_is_better=False),
        figure(f"view: reading {big_s} episodes, server side, s", r["load_big"], unit="s"),
        figure(f"view: reading {big_s} episodes vs records.read_records", ratio("load_big", "read_records_big"),
               higher_is_better=False),
        figure(f"view: scrolling {big_s} episodes, frame interval median, ms", r["frame_median_big"], unit="ms",
               target=16.7 * 1.05, higher_is_better=False, note="60 Hz frames are 16.7 ms apart"),
        figure(f"view: scrolling {big_s} episodes, frame interval p95, ms", r["frame_p95_big"], unit="ms"),
        figure(f"view: scrolling {big_s} episodes, drawing a new position median (script, style, layout), ms",
               r["draw_median_big"], unit="ms"),
        figure(f"view: scrolling {big_s} episodes, drawing a new position p95 (script, style, layout), ms",
               r["draw_p95_big"], unit="ms"),
        figure(f"view: scrolling, drawing a new position p95, {big_s} vs {small_s} episodes",
               ratio("draw_p95_big", "draw_p95_small"), target=1.5, higher_is_better=False),
        figure(f"view: list rows in the DOM at {big_s} episodes", r["dom_rows_big"], unit="rows"),
        figure(f"view: sort {big_s} episodes by reward, s", r["sort_big"], unit="s"),
        figure(f"view: filter {big_s} episodes by reward, s", r["filter_big"], unit="s"),
        figure(f"view: text search of {big_s} episodes, first, s", r["search_first_big"], unit="s"),
        figure(f"view: text search of {big_s} episodes, next, s", r["search_next_big"], unit="s"),
    ]
    if "html_ready_big" in r:
        figures.append(figure(f"view --html: page ready, {big_s} episodes, s", r["html_ready_big"], unit="s"))
    for f in figures:
        print(f"{f['name']}: {f['median']:.3g} ({f['min']:.3g} - {f['max']:.3g})"
              + ("" if f["met"] is None else f"  target {f['target']}: {'met' if f['met'] else 'NOT met'}"))
    write(args.json, figures, r)


if __name__ == "__main__":
    main()
