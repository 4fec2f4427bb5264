"""Episode files as the viewer reads them: rollouts and RecordEpisodes files, whatever they hold.

A file may be a rollout (``openenv-gym rollout --out``), a :class:`~openenv_gym.wrappers.RecordEpisodes`
file with its rotated predecessors (``episodes.jsonl.1`` ... ``.N``), or one still being written.
:func:`load` reads them all into one :class:`Rollouts`: a row of list columns per episode, the
searchable text of its conversation, and its line, kept as written. A line that is not a record is
skipped with a note naming the file and line; a last line without its newline is a record still
being written (or cut by a crash) and is skipped with a note too. Nothing a file holds makes
:func:`load` raise, save a file that cannot be read at all.

Why two decoders: a full :class:`~openenv_gym.records.EpisodeRecord` builds a dict per message,
about 90 us for an Arithmetic episode of 1.7 KB, 9 s for 100,000 of them. Listing needs only the
row fields and the text, which decode into small structs in a few microseconds (the figure is in
``benchmarks/view_bench.py``), so :func:`load` reads those, and :meth:`Rollouts.record` decodes the
one episode a reader opens with :func:`~openenv_gym.records.decode_record`, the code rollouts are
written with. A line whose row fields and messages decode but whose other fields do not (a
token-id list of strings, say) is listed, and opening it says what is wrong.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from openenv_gym.errors import ConfigurationError
from openenv_gym.records import EpisodeRecord, decode_record

__all__ = ["Rollouts", "expand", "load", "episode_text", "printable", "MAX_NOTES"]

MAX_NOTES = 50
"""Notes kept about skipped lines (a corrupt file could have millions); the rest are counted."""

_ROTATED = re.compile(r"\.(\d+)$")


# -- the fields a row and a search need, decoded without building the whole record ---------------


class _Message(msgspec.Struct):
    content: Any = None
    tool_calls: Any = None
    name: Any = None


class _Row(msgspec.Struct):
    """The list's fields of an :class:`~openenv_gym.records.EpisodeRecord`, with the same types."""

    env: str | None = None
    task_id: str | None = None
    split: str | None = None
    index: int | None = None
    messages: list[_Message] = []
    rewards: list[float] = []
    total_reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    errors: list[dict[str, Any]] = []
    group: int | None = None
    group_episode: int | None = None
    advantage: float | None = None
    completion_token_ids: Any = None
    seat: str | None = None
    game_id: str | None = None


class _Conversation(msgspec.Struct):
    messages: list[_Message] = []


_row_decoder = msgspec.json.Decoder(_Row)
_NOTHING = _Row()  # a line that decodes to this holds none of a record's fields (``{"a": 1}``)
_conversation_decoder = msgspec.json.Decoder(_Conversation)


def _content_texts(content: Any) -> Iterable[str]:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield part["text"]


def episode_text(messages: Sequence[Any]) -> str:
    """What a text search looks in: every message's text, and each tool call's name and arguments,
    with runs of whitespace made one space (so a phrase matches across a line break)."""
    parts: list[str] = []
    for m in messages:
        if isinstance(m, dict):  # a decoded record's message
            content, calls = m.get("content"), m.get("tool_calls")
        elif isinstance(m, _Message):
            content, calls = m.content, m.tool_calls
        else:
            continue
        parts.extend(_content_texts(content))
        if isinstance(calls, list):
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    for key in ("name", "arguments"):
                        value = fn.get(key)
                        if isinstance(value, str):
                            parts.append(value)
                        elif value is not None:
                            parts.append(msgspec.json.encode(value).decode())
    return " ".join(" ".join(parts).split())


def normalize_query(query: str) -> str:
    """A search query as :meth:`Rollouts.search` matches it: lower case, whitespace runs as one space."""
    return " ".join(query.split()).lower()


# -- files ----------------------------------------------------------------------------------------


def expand(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The files to read for ``paths``, oldest first: each path preceded by its rotated
    predecessors (``path.N`` ... ``path.1``, as :class:`~openenv_gym.wrappers.JsonlWriter` names
    them), each file once. A missing path is a :class:`~openenv_gym.errors.ConfigurationError`."""
    out: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise ConfigurationError(f"no such file: {raw}" if not path.exists() else f"not a file: {raw}")
        rotated: list[tuple[int, Path]] = []
        if not _ROTATED.search(path.name):
            prefix = path.name + "."
            for sibling in path.parent.iterdir():
                if sibling.name.startswith(prefix):
                    number = sibling.name[len(prefix):]
                    if number.isdigit() and sibling.is_file():
                        rotated.append((int(number), sibling))
        for _, file in sorted(rotated, reverse=True) + [(0, path)]:
            key = file.resolve()
            if key not in seen:
                seen.add(key)
                out.append(file)
    return out


class Rollouts:
    """Every episode of some files: list columns, searchable texts, and each record's line.

    Columns hold one entry per episode, in file order: ``env``/``file`` as indices into
    :attr:`envs`/:attr:`files`, ``line`` (1-based), ``task`` (``split/index``, else the task id),
    ``task_id``, ``group``, ``group_episode``, ``advantage``, ``reward`` (the total), ``turns``
    (agent actions), ``errors``, ``terminated``, ``truncated``, ``tokens`` (whether token ids
    were recorded), and for a game's seat (:mod:`openenv_gym.multiagent`) ``seat`` and ``game``
    (the game's id, shared by its seats' records).
    """

    COLUMNS = ("env", "file", "line", "task", "task_id", "group", "group_episode", "advantage", "reward",
               "turns", "errors", "terminated", "truncated", "tokens", "seat", "game")

    def __init__(self) -> None:
        self.files: list[str] = []
        self.envs: list[str] = []
        self.columns: dict[str, list[Any]] = {name: [] for name in self.COLUMNS}
        self.lines: list[bytes] = []
        self.notes: list[str] = []
        self.skipped = 0
        self._env_codes: dict[str, int] = {}
        self._texts: list[str] | None = None
        self._lowered: list[str] | None = None
        self._text_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.lines)

    # -- reading ---------------------------------------------------------------------------------

    def note(self, message: str) -> None:
        self.skipped += 1
        if len(self.notes) < MAX_NOTES:
            self.notes.append(message)

    def read(self, path: Path, label: str) -> None:
        """Add the episodes of one file (``label`` names it in notes and rows)."""
        code = len(self.files)
        self.files.append(label)
        with open(path, "rb") as fh:
            data = fh.read()
        start, number = 0, 0
        size = len(data)
        while start < size:
            end = data.find(b"\n", start)
            number += 1
            if end < 0:
                self.note(f"{label}: line {number} has no end (a record still being written, or cut off): skipped")
                break
            line = data[start:end]
            start = end + 1
            if line.strip():
                self._add(line, code, label, number)

    def _add(self, line: bytes, file: int, label: str, number: int) -> None:
        try:
            row = _row_decoder.decode(line)
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
            self.note(f"{label}: line {number} is not an episode record ({_short(exc)}): skipped")
            return
        if row == _NOTHING:
            self.note(f"{label}: line {number} is not an episode record (it has none of a record's fields): skipped")
            return
        env = row.env or ""
        code = self._env_codes.get(env)
        if code is None:
            code = self._env_codes[env] = len(self.envs)
            self.envs.append(env)
        c = self.columns
        c["env"].append(code)
        c["file"].append(file)
        c["line"].append(number)
        c["task"].append(f"{row.split}/{row.index}" if row.split is not None and row.index is not None
                         else row.task_id or "")
        c["task_id"].append(row.task_id)
        c["group"].append(row.group)
        c["group_episode"].append(row.group_episode)
        c["advantage"].append(row.advantage)
        c["reward"].append(row.total_reward)
        c["turns"].append(len(row.rewards))
        c["errors"].append(len(row.errors))
        c["terminated"].append(row.terminated)
        c["truncated"].append(row.truncated)
        c["tokens"].append(isinstance(row.completion_token_ids, list)
                           and any(ids for ids in row.completion_token_ids if isinstance(ids, list)))
        c["seat"].append(printable(row.seat) if row.seat is not None else None)
        c["game"].append(printable(row.game_id) if row.game_id is not None else None)
        self.lines.append(line)
        self._texts = self._lowered = None

    # -- reading one episode ---------------------------------------------------------------------

    def record(self, i: int) -> EpisodeRecord:
        """Episode ``i`` as the full record (``msgspec.DecodeError`` if its other fields are malformed)."""
        return decode_record(self.lines[i])

    def where(self, i: int) -> str:
        """``file:line`` of episode ``i``."""
        return f"{self.files[self.columns['file'][i]]}:{self.columns['line'][i]}"

    @property
    def texts(self) -> list[str]:
        """Each episode's searchable text (:func:`episode_text`), built at first use: about 2 s
        for 100,000 Arithmetic episodes, which a list never needs (a server builds it in the
        background once it answers)."""
        self._build_texts()
        assert self._texts is not None
        return self._texts

    def _build_texts(self) -> None:
        with self._text_lock:  # a search and the background build may ask at once
            if self._texts is None:
                texts = [episode_text(_conversation_decoder.decode(line).messages) for line in self.lines]
                self._lowered = [t.lower() for t in texts]
                self._texts = texts

    def prepare_search(self) -> None:
        """Build the search texts on a daemon thread (a server calls this once it answers, so the
        first search does not wait; a daemon, so stopping the server does not either)."""
        threading.Thread(target=self._build_texts, name="openenv-gym-view-texts", daemon=True).start()

    def search(self, query: str) -> list[int]:
        """The episodes whose conversation text holds ``query`` (case-insensitive; whitespace runs
        match any whitespace run); every episode for an empty query."""
        q = normalize_query(query)
        if not q:
            return list(range(len(self)))
        self._build_texts()
        assert self._lowered is not None
        return [i for i, text in enumerate(self._lowered) if q in text]


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def load(paths: Iterable[str | os.PathLike[str]]) -> Rollouts:
    """Read every episode of ``paths`` (rotated predecessors included, oldest first; see :func:`expand`)."""
    files = expand(paths)
    rollouts = Rollouts()
    labels = _labels(files)
    for path, label in zip(files, labels):
        try:
            rollouts.read(path, label)
        except OSError as exc:
            raise ConfigurationError(f"cannot read {label}: {exc.strerror or exc}") from None
    return rollouts


def _labels(files: list[Path]) -> list[str]:
    """Short names for the files: their names, or their paths where two share a name; a byte of
    a name that is not UTF-8 is shown escaped (``\\udcff``), so a terminal and a page can print it."""
    names = [f.name for f in files]
    return [printable(str(f) if names.count(f.name) > 1 else f.name) for f in files]


def printable(name: str) -> str:
    """``name`` with any byte that is not UTF-8 (a file name's) written as an escape."""
    return name.encode("utf-8", "backslashreplace").decode("utf-8")
