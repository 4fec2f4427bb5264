"""The view page without a browser: what the file embeds, what the server answers, the command.

A browser runs the page in tests/web/test_browser.py; here: a written file holds every record and
fetches nothing (its CSP says so), no text of a record can close the block it sits in, the
served API gives the records rollouts wrote, and ``openenv-gym view --html`` works from the
command line.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import httpx
import pytest
from web_fixtures import hostile_file, hostile_texts, recorded_files, rollout_file, serve  # noqa: F401 (pytest fixtures, used by name)

from openenv_gym.cli import main
from openenv_gym.records import read_records
from openenv_gym.web.page import asset
from openenv_gym.web.rollouts import load
from openenv_gym.web.view import VIEW_PAGE, render_file, view_server


def _blocks(page: str) -> dict[str, str]:
    return dict(re.findall(r'<script type="[a-z/]+" id="(og-[a-z]+)">(.*?)</script>', page, re.S))


def test_a_written_page_embeds_every_record_and_fetches_nothing(rollout_file: Path) -> None:
    page = render_file(load([rollout_file]), "groups.jsonl").decode()
    blocks = _blocks(page)
    index = json.loads(blocks["og-index"])
    assert index["mode"] == "file" and len(index["columns"]["reward"]) == 32
    records = read_records(rollout_file)
    lines = blocks["og-records"].split("\n")
    assert len(lines) == 32
    first = json.loads(lines[0])
    assert first["record"]["messages"] == records[0].messages and first["where"] == "groups.jsonl:1"
    assert index["tools"][first["tools"]] == records[0].tools and len(index["tools"]) == 1  # tool lists once
    texts = [json.loads(t) for t in blocks["og-texts"].split("\n")]
    assert "Correct!" in " ".join(texts) or "Incorrect." in " ".join(texts)
    csp = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1))
    assert "connect-src 'none'" in csp and "default-src 'none'" in csp and "img-src data:" in csp
    assert "'unsafe-inline'" not in csp
    # Nothing that loads from elsewhere: no src=, href= but the empty icon, @import or url().
    assert re.findall(r'(?:src|href)="([^"]*)"', page) == ["data:,"]
    assert "@import" not in page and "url(" not in asset("style.css")


def test_no_text_in_a_record_becomes_markup(hostile_file: Path, hostile_texts: list[str]) -> None:
    page = render_file(load([hostile_file])).decode()
    # Only the page's own scripts and the data blocks open a <script>; the records' texts are escaped.
    assert page.count("<script") == 3 + len(VIEW_PAGE.scripts)
    assert page.count("</script>") == 3 + len(VIEW_PAGE.scripts)
    assert "<img" not in page and "<!--" not in page.split("<body", 1)[1]
    record = json.loads(_blocks(page)["og-records"])["record"]
    assert [m["content"] for m in record["messages"]] == [hostile_texts[0], hostile_texts[2], hostile_texts[3]]


def test_the_served_api_gives_the_records_and_searches(serve, rollout_file: Path) -> None:
    server, rollouts = view_server([rollout_file])
    served = serve(server)
    records = read_records(rollout_file)
    auth = {"Authorization": f"token {served.token}"}
    with httpx.Client(base_url=served.base, headers=auth, timeout=30) as client:
        page = client.get("/").text
        index = json.loads(_blocks(page)["og-index"])
        assert index["mode"] == "served" and set(_blocks(page)) == {"og-index"}
        assert index["summary"]["episodes"] == 32 and index["summary"]["groups"]["k"] == 4
        got = client.get("/api/episode/3").json()
        assert got["record"]["messages"] == records[3].messages and got["where"] == "groups.jsonl:4"
        assert got["record"]["completion_token_ids"] == records[3].completion_token_ids
        for bad in ("32", "-1", "x", "1e3"):
            assert client.get(f"/api/episode/{bad}").status_code == 404
        found = client.get("/api/search", params={"q": "CORRECT!"}).json()["matches"]
        assert found == [i for i, r in enumerate(records) if r.total_reward > 0]
        assert client.get("/api/search").json()["matches"] == list(range(32))


def test_view_html_from_the_command_line(rollout_file: Path, recorded_files: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(rollout_file.read_bytes()[:-10])
    out = tmp_path / "page.html"
    assert main(["view", str(torn), str(recorded_files), "--html", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "skipped 1 line(s)" in printed and "torn.jsonl: line 32 has no end" in printed
    assert f"wrote 37 episodes to {out}" in printed
    index = json.loads(_blocks(out.read_text())["og-index"])
    assert index["files"] == ["torn.jsonl"] + [f"episodes.jsonl.{n}" for n in (5, 4, 3, 2, 1)] + ["episodes.jsonl"]
    assert index["notes"] and index["skipped"] == 1
    assert main(["view", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_view_serves_until_ctrl_c(rollout_file: Path, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "openenv_gym.cli", "view", str(rollout_file)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        printed = ""
        while "http://" not in printed:
            line = process.stdout.readline()
            assert line, printed
            printed += line
        assert "32 episodes from groups.jsonl" in printed
        url = re.search(r"http://127\.0\.0\.1:\d+/\?token=[\w-]+", printed).group(0)
        assert "<html" in httpx.get(url, follow_redirects=True, timeout=30).text
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=30)
        assert process.returncode == 0 and out.strip().endswith("stopped")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
