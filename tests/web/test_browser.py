"""Both pages in a real headless Chromium, clicked through as a person would.

Needs Debian's ``chromium`` and the ``playwright`` package (``pip install -e '.[browser]'``);
marked ``browser`` and run in a CI step of its own: ``pytest -m browser -n 0 tests/web``. Every
test records each request the page makes (HTTP and WebSocket) and asserts that all go to the
page's own loopback server, or, for a written file, nowhere beyond the file itself.

With ``OPENENV_GYM_SCREENSHOTS=DIR`` the tests save the README's screenshots there
(``view.png``, ``view-group.png``, ``play.png``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright
from web_fixtures import hostile_file, hostile_texts, rollout_file, serve, started_worker  # noqa: F401 (pytest fixtures, used by name)

from openenv_gym.records import read_records
from openenv_gym.testing import procs
from openenv_gym.web.view import view_server, write_html

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("OPENENV_GYM_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Without the background-networking flags Chromium phones home at start (component updates,
# safe browsing): none of that may leave a test machine.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions"]
SHOTS = os.environ.get("OPENENV_GYM_SCREENSHOTS")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1400, "height": 900})
        yield context
        context.close()


class Watched:
    """A page and everything it asked for: request URLs, WebSocket URLs, errors, dialogs."""

    def __init__(self, page: Page):
        self.page, self.requests, self.sockets, self.errors, self.dialogs = page, [], [], [], []
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("websocket", lambda ws: self.sockets.append(ws.url))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def only_to(self, prefix: str) -> None:
        """Every request went to ``prefix`` (the server's ``http://127.0.0.1:PORT/``, whose
        WebSocket is ``ws://`` the same), or is a ``data:`` URL."""
        assert self.requests, "the page made no request at all?"
        allowed = (prefix, prefix.replace("http://", "ws://", 1), "data:")
        outside = [u for u in self.requests + self.sockets if not u.startswith(allowed)]
        assert outside == [], f"the page fetched from elsewhere: {outside}"
        assert self.errors == [] and self.dialogs == []


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    page = browser.new_page()
    yield Watched(page)
    page.close()


def open_view(watched: Watched, mode: str, files: list[Path], serve: Any, tmp_path: Path) -> str:
    """Open the view page of ``files`` (served, or written to a file); the prefix its requests must have."""
    if mode == "served":
        server, _ = view_server(files)
        served = serve(server)
        watched.page.goto(served.url)
        prefix = served.base + "/"
    else:
        out = tmp_path / "page.html"
        write_html(files, out)
        prefix = out.as_uri()
        watched.page.goto(prefix)
    watched.page.wait_for_selector("body[data-ready='1']")
    return prefix


def shown(page: Page) -> list[dict[str, str]]:
    """The list's visible rows, top to bottom, as ``{column: text}``."""
    return page.evaluate("""() => [...document.querySelectorAll('#list .row:not([hidden])')]
        .sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top)
        .map(r => Object.fromEntries([...r.children].map(c => [c.className.split('c-')[1], c.textContent])))""")


def wait_until(page: Page, expression: str, timeout: float = 20.0) -> None:
    """Poll ``expression`` in the page until it is true. (Playwright's ``wait_for_function`` runs
    its predicate through ``eval``, which the pages' CSP rightly forbids; ``evaluate`` does not.)"""
    deadline = time.monotonic() + timeout
    while not page.evaluate(f"() => Boolean({expression})"):
        if time.monotonic() > deadline:
            raise AssertionError(f"still false after {timeout} s: {expression}")
        time.sleep(0.05)


def count(page: Page) -> str:
    return page.inner_text("#count")


@pytest.mark.parametrize("mode", ["served", "file"])
def test_view_open_filter_sort_read_a_tool_call_and_a_group(watched: Watched, serve: Any, tmp_path: Path,
                                                            rollout_file: Path, mode: str) -> None:
    page = watched.page
    records = read_records(rollout_file)
    prefix = open_view(watched, mode, [rollout_file], serve, tmp_path)
    summary = page.inner_text("#summary")
    assert "32\nepisodes" in summary and "groups of 4" in summary and "pass@4" in summary and "mean@4" in summary
    assert count(page) == "32 episodes" and len(shown(page)) == 32
    wins = sum(r.total_reward > 0 for r in records)
    page.fill("#f-min", "1")
    assert count(page) == f"{wins} of 32 episodes" and {r["reward"] for r in shown(page)} == {"1"}
    page.fill("#f-min", "")
    page.fill("#f-text", "incorrect")
    wait_until(page, f"document.querySelector('#count').textContent === '{32 - wins} of 32 episodes'")
    assert {r["reward"] for r in shown(page)} == {"0"}
    page.fill("#f-text", "")
    page.fill("#f-group", "1")  # sub-env group 1: its four tasks, four episodes each
    wait_until(page, "document.querySelector('#count').textContent.startsWith('16 of')")
    page.fill("#f-group", "1/2")  # the group that played one task
    wait_until(page, "document.querySelector('#count').textContent.startsWith('4 of')")
    assert {r["group"] for r in shown(page)} == {"1/2"}
    page.fill("#f-group", "")
    page.click("#list-head [data-key=reward]")  # highest first
    rewards = [float(r["reward"]) for r in shown(page)]
    assert rewards == sorted(rewards, reverse=True) and count(page) == "32 episodes"
    # Open the first episode that won; read its calculator call and the tool's answer.
    first = int(shown(page)[0]["n"]) - 1
    page.click(f"#list .row[data-i='{first}']")
    page.wait_for_selector("#detail .chat")
    record = records[first]
    call = page.locator("#detail .call").first
    assert call.locator(".call-name").inner_text() == "calculator"
    question = record.messages[1]["tool_calls"][0]["function"]["arguments"]
    assert call.locator(".args").inner_text() == json.dumps(json.loads(question), indent=2)
    assert page.locator("#detail .role-tool .text").first.inner_text() == record.messages[2]["content"]
    assert "turn 2 reward 1" in page.inner_text("#detail")
    # Token ids with logprobs: coloured by logprob.
    page.click("#detail details.tokens >> nth=0")
    token = page.locator("#detail .tok").first
    assert token.get_attribute("title").startswith(f"id {record.completion_token_ids[0][0]} · logprob -0.250")
    assert token.evaluate("t => getComputedStyle(t).backgroundColor") != "rgb(238, 238, 238)"
    if SHOTS and mode == "served":
        page.screenshot(path=os.path.join(SHOTS, "view.png"))
    # The group, side by side, with its advantages.
    page.click("#detail .group-button")
    columns = page.locator("#group-view .group-column")
    columns.nth(3).locator(".chat").wait_for()
    assert columns.count() == 4
    group = [r for r in records if (r.group, r.group_episode) == (record.group, record.group_episode)]
    heads = [columns.nth(k).locator(".group-column-head").inner_text() for k in range(4)]
    for head, member in zip(heads, group):
        assert f"reward {member.total_reward:g}" in head
        assert "advantage " + (f"+{member.advantage:.3g}" if member.advantage > 0 else f"{member.advantage:.3g}") in head
    if SHOTS and mode == "served":
        page.screenshot(path=os.path.join(SHOTS, "view-group.png"))
    page.keyboard.press("Escape")
    assert page.locator("#group-view").is_hidden()
    watched.only_to(prefix)


@pytest.mark.parametrize("mode", ["served", "file"])
def test_markup_in_a_conversation_stays_text(watched: Watched, serve: Any, tmp_path: Path, hostile_file: Path,
                                             hostile_texts: list[str], mode: str) -> None:
    page = watched.page
    prefix = open_view(watched, mode, [hostile_file], serve, tmp_path)
    page.click("#list .row[data-i='0']")
    page.wait_for_selector("#detail .chat")
    text = page.inner_text("#detail")
    for hostile in [hostile_texts[0], hostile_texts[2], hostile_texts[3]]:
        assert hostile in text
    assert json.loads(page.locator("#detail .args").inner_text()) == {"expression": hostile_texts[1]}
    assert "<b>Bold</b>: " + hostile_texts[1] in page.inner_text("#detail .errors")
    page.fill("#f-text", "<script>")
    wait_until(page, "document.querySelector('#count').textContent === '1 episode'")
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate("document.querySelectorAll('#detail img, #detail script, #detail b').length") == 0
    watched.only_to(prefix)


def test_a_large_list_draws_only_what_is_in_sight(watched: Watched, serve: Any, tmp_path: Path,
                                                  rollout_file: Path) -> None:
    lines = rollout_file.read_bytes().splitlines(keepends=True)
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"".join(lines[k % len(lines)] for k in range(5000)))
    page = watched.page
    prefix = open_view(watched, "served", [big], serve, tmp_path)
    assert count(page) == "5,000 episodes"
    assert page.evaluate("document.querySelectorAll('#list .row').length") < 80
    page.evaluate("document.querySelector('#list').scrollTop = 1e9")
    wait_until(page, "[...document.querySelectorAll('#list .row:not([hidden])')].some(r => r.dataset.i === '4999')")
    assert shown(page)[-1]["n"] == "5,000"  # counts are written one way on the page
    page.click("#list .row[data-i='4990']")
    assert page.inner_text("#detail h2") == "Episode 4,991"
    watched.only_to(prefix)


class PlayCommand:
    """``openenv-gym play`` as a user runs it: a process, its URL printed."""

    def __init__(self, tmp_path: Path, *args: str):
        self.process = subprocess.Popen([sys.executable, "-m", "openenv_gym.cli", "play", *args], cwd=tmp_path,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.output = ""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "http://" not in self.output:
            line = self.process.stdout.readline()
            if not line:
                break
            self.output += line
        match = re.search(r"http://\S+", self.output)
        if not match:
            self.process.kill()
            raise RuntimeError(self.output)
        self.url = match.group(0)
        self.prefix = self.url.split("?")[0]  # http://127.0.0.1:PORT/

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; killed, with what it started, if that did not do."""
        left = procs.descendants(self.process.pid)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        for pid in procs.wait_dead(left, timeout=10):
            os.kill(pid, signal.SIGKILL)


def test_play_calculator_then_submit_gets_reward_1(watched: Watched, tmp_path: Path) -> None:
    play = PlayCommand(tmp_path, "openenv/Arithmetic-v0", "--linger", "1", "--out", "mine.jsonl")
    servers = procs.descendants(play.process.pid)
    page = watched.page
    try:
        page.goto(play.url)
        page.wait_for_selector("body[data-ready='1']")
        prompt = page.inner_text("#chat .role-user .text")
        expression = re.search(r"Compute (.+?)\. ", prompt).group(1)
        page.fill("form[data-tool=calculator] [name=expression]", expression)
        page.click("form[data-tool=calculator] button[type=submit]")
        page.wait_for_selector("#chat .role-tool")
        answer = page.inner_text("#chat .role-tool .text")
        assert "last reward 0" in page.inner_text("#status")
        page.fill("form[data-tool=submit] [name=answer]", answer)
        page.click("form[data-tool=submit] button[type=submit]")
        page.wait_for_selector("#status .ended")
        status = page.inner_text("#status")
        assert "total reward 1" in status and "last reward 1" in status and "episode ended: terminated" in status
        assert page.inner_text("#chat .role-tool >> nth=1").endswith("Correct!")
        # The episode is over: its tools and reply wait for a new one, and the status says how.
        assert page.is_disabled("form[data-tool=submit] button[type=submit]")
        assert page.is_disabled("#reply button[type=submit]") and not page.is_disabled("#r-go")
        assert "New episode starts another" in status
        page.click("#save")
        wait_until(page, "document.querySelector('#saved').textContent.startsWith('saved 1 episode')")
        if SHOTS:
            page.screenshot(path=os.path.join(SHOTS, "play.png"))
        # A new episode on a chosen task.
        page.select_option("#r-split", "test")
        page.fill("#r-index", "3")
        page.click("#r-go")
        wait_until(page, "document.querySelector('#status').textContent.includes('task test/3')")
        assert page.locator("#chat .role-assistant").count() == 0
        watched.only_to(play.prefix)
        assert watched.sockets == [play.prefix.replace("http://", "ws://") + "api/live?token=" + play.url.split("token=")[1]]
        assert page.context.cookies() == []  # the token is in no cookie, which other local servers would get
        page.close()  # the last page: the server stops after --linger, and the env with it
        assert play.process.wait(30) == 0
        assert procs.wait_dead(servers) == []
    finally:
        play.stop()
    [record] = read_records(tmp_path / "mine.jsonl")
    assert record.total_reward == 1.0 and record.terminated
    calls = [c["id"] for m in record.messages for c in m.get("tool_calls") or []]
    answers = [m["tool_call_id"] for m in record.messages if m["role"] == "tool"]
    assert len(calls) == 2 and len(set(calls)) == 2 and answers == calls  # each answer names its own call


@pytest.mark.needs("pettingzoo", "verifiers")
def test_play_a_seat_of_a_game_against_a_model(watched: Watched, tmp_path: Path) -> None:
    """``play --seat player1`` takes one seat of kuhn poker; the other is a model behind an
    OpenAI-compatible endpoint (a scripted stub here, betting with a king)."""
    from openenv_gym.testing.openai_stub import OpenAIStub

    def player0(body: dict) -> dict:
        seen = "\n".join(m["content"] for m in body["messages"] if isinstance(m.get("content"), str))
        return {"role": "assistant", "content": "[bet]" if "Your private card: K" in seen else "[check]"}

    with OpenAIStub(player0) as stub:
        play = PlayCommand(tmp_path, "openenv/KuhnPoker-v0", "--seat", "player1",
                           "--opponent-url", stub.url, "--opponent-model", "stub", "--linger", "1", "--out", "mine.jsonl")
        page = watched.page
        try:
            page.goto(play.url)
            page.wait_for_selector("body[data-ready='1']")
            wait_until(page, "document.querySelector('#chat') && document.querySelector('#chat').textContent.includes('Player 1')")
            chat = page.inner_text("#chat")
            assert "You are playing Kuhn poker as Player 1" in chat and "as Player 0" not in chat  # one seat's view
            legal = re.findall(r"Your legal actions: (.*)\.", chat)[-1]
            move = "[call]" if "[call]" in legal else "[check]"
            page.fill("#reply-text", move)
            page.click("#reply button[type=submit]")
            page.wait_for_selector("#status .ended")
            status = page.inner_text("#status")
            assert "episode ended: terminated" in status
            page.click("#save")
            wait_until(page, "document.querySelector('#saved').textContent.startsWith('saved 1 episode')")
            page.close()
            assert play.process.wait(60) == 0
        finally:
            play.stop()
        assert len(stub.requests) >= 1  # the opponent's seat asked the model
    [record] = read_records(tmp_path / "mine.jsonl")
    assert record.terminated and record.total_reward in (-2.0, -1.0, 1.0, 2.0)
    assert record.messages[0]["role"] == "system" and "Player 1" in record.messages[0]["content"]


def test_play_shows_a_slow_step_and_a_bad_argument(watched: Watched, tmp_path: Path) -> None:
    play = PlayCommand(tmp_path, "openenv/ORS-v0", "adapter=openenv_gym.testing.latency:LatencyAdapter",
                       "median=2", "sigma=0")
    page = watched.page
    try:
        page.goto(play.url)
        page.wait_for_selector("body[data-ready='1']")
        page.click("form[data-tool=wait] button[type=submit]")
        wait_until(page, "document.querySelector('#status').textContent.includes('waiting for the env')")
        assert page.locator("#r-go").is_disabled()
        wait_until(page, "document.querySelector('#status').textContent.includes('turn 1')", timeout=30)
        assert not page.locator("#r-go").is_disabled()
        watched.only_to(play.prefix)
    finally:
        play.stop()


def test_play_tool_forms_follow_the_schema(watched: Watched, serve: Any, tmp_path: Path) -> None:
    import gymnasium as gym

    from openenv_gym.web.access import Access
    from openenv_gym.web.play import PlaySession, make_app
    from openenv_gym.web.serving import LoopbackServer

    env = gym.make("openenv/Arithmetic-v0")
    session = PlaySession(env, "openenv/Arithmetic-v0", tmp_path / "p.jsonl")
    session.reset(seed=0)
    session.record.tools = [{"type": "function", "function": {"name": "typed", "description": "every kind", "parameters": {
        "type": "object", "required": ["n"], "properties": {
            "n": {"type": "integer"}, "x": {"type": "number"}, "flag": {"type": "boolean"},
            "mode": {"enum": ["a", "b"]}, "items": {"type": "array"}, "s": {"type": ["string", "null"]}}}}}]
    served = serve(LoopbackServer(make_app(session, started_worker(), linger=60), Access()))
    page = watched.page
    page.goto(served.url)
    page.wait_for_selector("body[data-ready='1']")
    form = "form[data-tool=typed]"
    assert page.get_attribute(f"{form} [name=n]", "type") == "number"
    assert page.evaluate(f"[...document.querySelector('{form} [name=mode]').options].map(o => o.value)") == ["", '"a"', '"b"']
    page.click(f"{form} button[type=submit]")
    assert page.inner_text(f"{form} .field-error >> nth=0") == "required"
    page.fill(f"{form} [name=n]", "2.5")
    page.click(f"{form} button[type=submit]")
    assert page.inner_text(f"{form} .field-error >> nth=0") == "not an integer"
    page.fill(f"{form} [name=n]", "2")
    page.fill(f"{form} [name=items]", "[1, ")
    page.click(f"{form} button[type=submit]")
    assert "not valid JSON" in page.inner_text(form)
    page.fill(f"{form} [name=items]", '[1, "two"]')
    page.select_option(f"{form} [name=mode]", '"b"')
    page.select_option(f"{form} [name=flag]", "false")
    page.fill(f"{form} [name=s]", "text")
    page.click(f"{form} button[type=submit]")
    page.wait_for_selector("#chat .role-assistant .args")
    assert json.loads(page.inner_text("#chat .role-assistant .args")) == {"n": 2, "flag": False, "mode": "b",
                                                                         "items": [1, "two"], "s": "text"}
    assert "typed" in page.inner_text("#chat .role-tool")  # Arithmetic answers: unknown tool
    watched.only_to(served.base + "/")


def test_a_megabyte_of_unbroken_text_paints_at_once_and_shows_whole_on_request(watched: Watched, serve: Any,
                                                                             tmp_path: Path) -> None:
    """Degenerate model output (one run of a repeated token, base64) has exactly this shape."""
    from openenv_gym.records import EpisodeRecord, encode_record

    text = "ab" * 500_000
    path = tmp_path / "long.jsonl"
    path.write_bytes(encode_record(EpisodeRecord(env="openenv/Arithmetic-v0", messages=[
        {"role": "user", "content": "go"}, {"role": "assistant", "content": text}], rewards=[0.0])))
    page = watched.page
    prefix = open_view(watched, "served", [path], serve, tmp_path)
    page.click("#list .row[data-i='0']")
    page.wait_for_selector("#detail .show-all", timeout=10_000)
    shown_text = "[...document.querySelectorAll('#detail .role-assistant .text')].map(e => e.textContent.length)"
    assert page.evaluate(shown_text) == [20_000]
    assert page.inner_text("#detail .show-all") == "show all 1,000,000 characters"
    page.click("#detail .show-all")
    wait_until(page, f"{shown_text}[0] === 1000000")
    watched.only_to(prefix)


@pytest.mark.parametrize("mode", ["served", "file"])
def test_an_episode_has_a_link_that_opens_it(watched: Watched, serve: Any, tmp_path: Path, rollout_file: Path,
                                             mode: str) -> None:
    page = watched.page
    prefix = open_view(watched, mode, [rollout_file], serve, tmp_path)
    page.click("#list .row[data-i='2']")
    wait_until(page, "location.hash === '#episode-3'")
    link = page.url
    assert "#episode-3" in link and ("token=" in link) == (mode == "served")  # a served page keeps its token
    other = watched.page.context.new_page()
    try:
        other.goto(link)
        other.wait_for_selector("body[data-ready='1']")
        wait_until(other, "document.querySelector('#detail h2') && document.querySelector('#detail h2').textContent === 'Episode 3'")
        assert other.get_attribute("#list .row[data-i='2']", "class").split().count("selected") == 1
        # The task column shows the whole task; a cell cut short shows it all on hover.
        cell = other.locator("#list .row[data-i='2'] .c-task")
        assert cell.get_attribute("title") == cell.inner_text()
    finally:
        other.close()
    watched.only_to(prefix)


@pytest.mark.parametrize("mode", ["served", "file"])
def test_a_games_seats_show_side_by_side_with_their_rewards(watched: Watched, serve: Any, tmp_path: Path,
                                                            mode: str) -> None:
    """Records of a game's seats (openenv_gym.multiagent's vector env writes one per seat) share a
    game id: one opens the game's seats side by side, each headed by its seat and reward."""
    from openenv_gym.records import EpisodeRecord, write_records

    def seat(game: str, name: str, reward: float, card: str) -> EpisodeRecord:
        other = "player1" if name == "player0" else "player0"
        return EpisodeRecord(env="openenv/Kuhn-v0", env_id=0, task_id=f"hand#{game}", split="train", index=int(game),
                             messages=[{"role": "system", "content": f"You are {name}; your card: {card}."},
                                       {"role": "assistant", "content": "[bet]"}],
                             rewards=[reward], total_reward=reward, terminated=True, seat=name,
                             game_id=f"game-{game}", other_seats=[other])

    path = tmp_path / "games.jsonl"
    write_records(path, [seat("1", "player0", 2.0, "K"), seat("1", "player1", -2.0, "Q"),
                         seat("2", "player0", -1.0, "J"), seat("2", "player1", 1.0, "K")])
    page = watched.page
    prefix = open_view(watched, mode, [path], serve, tmp_path)
    assert [row["task"] for row in shown(page)] == ["train/1 · player0", "train/1 · player1", "train/2 · player0",
                                                    "train/2 · player1"]
    page.click("#list .row[data-i='3']")
    page.wait_for_selector("#detail .game-button")
    facts = page.inner_text("#detail .facts")
    assert "player1" in facts and "game-2" in facts
    page.click("#detail .game-button")
    columns = page.locator("#group-view .group-column")
    columns.nth(1).locator(".chat").wait_for()
    assert columns.count() == 2
    assert page.inner_text("#group-view h2").startswith("Game game-2 · 2 seats")
    heads = [columns.nth(k).locator(".group-column-head").inner_text() for k in range(2)]
    assert "player0" in heads[0] and "reward -1" in heads[0]
    assert "player1" in heads[1] and "reward 1" in heads[1]
    assert "your card: J" in columns.nth(0).inner_text() and "your card: K" in columns.nth(1).inner_text()
    page.keyboard.press("Escape")
    assert page.locator("#group-view").is_hidden()
    watched.only_to(prefix)
