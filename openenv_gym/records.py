"""The record of one finished episode, as a trainer reads it, and its JSONL encoding.

:class:`EpisodeRecord` is what :class:`~openenv_gym.wrappers.RecordEpisodes` writes for every
finished episode of a single env, and what a rollout (``rollout.collect``) writes for every
episode of a vector env: one JSON object per line. It holds everything a trainer needs to build a
sample without asking the environment again: which task was played (enough to replay it through
``reset(options=record.reset_options())``), the tools offered, the whole conversation in order,
per-turn rewards, how the episode ended, the errors reported on the way, the group and advantage
of grouped collection, and, when a policy or :class:`~openenv_gym.wrappers.ChatTokens` provides
them, each assistant turn's prompt and completion token ids and logprobs.

Messages are plain OpenAI-format dicts (what a chat template consumes), as everywhere in the
package (docs/architecture.md, "The Gymnasium contract"). The agent's own turns are normalised by
:func:`as_assistant_message`, so every assistant message in a record can be sent back to the env
as an action and every ``tool`` message answers a call id that appears in the conversation.

A record holds only what the conversation already holds plus the task reference: never an env's
kwargs (API keys, URLs with tokens) and nothing else from ``info``.

Writing is safe to read while it happens: every record is one line written by one ``write`` call,
and :func:`iter_records` yields only complete lines, so a reader never sees half a record; a line
damaged by a writer that failed mid-line costs only itself (skipped with a warning).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from openenv_gym.wire import AssistantMessage, Message, decode_with, to_plain_json

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "EpisodeRecord",
    "as_assistant_message",
    "encode_record",
    "encode_record_into",
    "decode_record",
    "iter_records",
    "read_records",
    "write_records",
]

_SURROGATE = re.compile("[\ud800-\udfff]")


class EpisodeRecord(msgspec.Struct, kw_only=True):
    """One finished episode: the task, the conversation, the rewards, and what a trainer adds.

    Field names follow the keys ``rollout.run`` has always written, so old JSONL files decode
    into this type (unknown keys are ignored, missing ones take their defaults).

    Every per-assistant-turn list (``prompt_token_ids``, ``completion_token_ids``, ``logprobs``)
    has one entry per assistant message of :attr:`messages`, in order, or is ``None`` as a whole
    when nothing provided it; an entry is ``None`` for a turn whose tokens are unknown (e.g. a
    text action under :class:`~openenv_gym.wrappers.ChatTokens` has prompt ids but no completion
    ids).
    """

    env: str | None = None
    """The registered Gymnasium id (``"openenv/Arithmetic-v0"``), when the env has a spec."""
    env_id: int | None = None
    """The sub-env index in a vector env (the key ``rollout.run`` uses); ``None`` for a single env."""
    task_id: str | None = None
    """The task's stable name (``info["task_id"]``, e.g. ``"train/17"``)."""
    split: str | None = None
    index: int | None = None
    """The task's index in ``split``; ``None`` for an explicit task spec."""
    task: dict[str, Any] | None = None
    """The explicit task spec passed as ``reset(options={"task": ...})``, if one was."""
    seed: int | None = None
    """The seed passed to the ``reset`` that began the episode, if one was."""
    tools: list[dict[str, Any]] | None = None
    """The tools offered at the start of the episode (OpenAI ``tools`` entries)."""
    messages: list[Message] = []
    """The whole conversation, in order: the opening (system/user), then each assistant message
    followed by the messages that answered it (tool/user)."""
    rewards: list[float] = []
    """One reward per step (per assistant message)."""
    total_reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    errors: list[dict[str, Any]] = []
    """Every ``info["error"]`` of the episode (``{"type", "message"}``), in order."""
    group: int | None = None
    """Grouped collection: the group of sub-envs that played this task."""
    group_episode: int | None = None
    """Grouped collection: which of the group's episodes this is (0, 1, ...)."""
    advantage: float | None = None
    """Grouped collection: ``(r - mean) / (std + eps)`` over the group's total rewards."""
    prompt_token_ids: list[list[int] | None] | None = None
    """Per assistant turn: the token ids of the prompt the turn was generated from."""
    completion_token_ids: list[list[int] | None] | None = None
    """Per assistant turn: the token ids the model generated."""
    logprobs: list[list[float] | None] | None = None
    """Per assistant turn: the log-probability of each completion token."""
    seat: str | None = None
    """A game's seat whose trajectory this is (:mod:`openenv_gym.multiagent`); ``None`` for a single agent."""
    game_id: str | None = None
    """The game the seat played: every seat's record of one game carries the same id."""
    other_seats: list[str] | None = None
    """The game's other seats (their records share :attr:`game_id`)."""

    def reset_options(self) -> dict[str, Any]:
        """The ``reset`` options that start this episode's task again: ``{"task": spec}`` for an
        explicit task, else ``{"split", "index"}``."""
        if self.task is not None:
            return {"task": self.task}
        options: dict[str, Any] = {}
        if self.split is not None:
            options["split"] = self.split
        if self.index is not None:
            options["index"] = self.index
        return options

    def actions(self) -> list[Message]:
        """The agent's actions, in order: the assistant messages of the conversation."""
        return [m for m in self.messages if isinstance(m, dict) and m.get("role") == "assistant"]


# -- the agent's turn as a message --------------------------------------------------------------


def as_assistant_message(action: Any) -> Message:
    """``action`` as an OpenAI assistant message dict, the form records and histories hold.

    Text becomes ``{"role": "assistant", "content": text}``; a dict or an
    :class:`~openenv_gym.wire.AssistantMessage` is copied with ``role`` set to ``assistant``, each
    tool call given the id :func:`~openenv_gym.actions.parse_action` would give it (``call_<n>``,
    so the ``tool`` answers pair up) and ``type: "function"``, and dict ``arguments`` encoded as a
    JSON string (the OpenAI form). Anything else (``None``, a number, a list: values the env
    answers as unreadable) becomes an assistant message with no content. Never raises; the
    caller's objects are never modified.
    """
    if isinstance(action, str):
        return {"role": "assistant", "content": str(action)}
    if isinstance(action, AssistantMessage):
        try:
            action = msgspec.to_builtins(action)
        except Exception:
            return {"role": "assistant", "content": None}
    if not isinstance(action, dict):
        return {"role": "assistant", "content": None}
    try:
        message = dict(action)
    except Exception:  # a dict subclass whose own methods fail
        return {"role": "assistant", "content": None}
    message["role"] = "assistant"
    content = message.get("content")
    if isinstance(content, (list, tuple)):
        message["content"] = list(content)
    calls = message.get("tool_calls")
    if isinstance(calls, (list, tuple)):
        message["tool_calls"] = [_call(n, c) for n, c in enumerate(calls)]
    return message


def _call(n: int, call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    out = dict(call)
    if not out.get("id"):
        out["id"] = f"call_{n}"
    out.setdefault("type", "function")
    fn = out.get("function")
    if isinstance(fn, dict):
        fn = dict(fn)
        if isinstance(fn.get("arguments"), dict):
            plain, why = to_plain_json(fn["arguments"])
            if why is None:  # arguments that are not plain JSON stay as they were: the env answered them
                fn["arguments"] = json.dumps(plain, ensure_ascii=False)
        out["function"] = fn
    return out


# -- JSONL ----------------------------------------------------------------------------------------


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    # Something no model wrote (an object inside a trainer's message): name its type, nothing more
    # (its repr could hold anything).
    return f"<{type(obj).__name__}>"


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.json.Decoder(EpisodeRecord)


def _scrub(value: Any) -> Any:
    """``value`` with every lone surrogate replaced by U+FFFD (UTF-8 cannot hold them)."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_scrub(k) if isinstance(k, str) else k: _scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub(v) for v in value]
    if isinstance(value, msgspec.Struct):
        return _scrub(msgspec.to_builtins(value, enc_hook=_enc_hook))
    return value


def encode_record(record: EpisodeRecord | dict[str, Any]) -> bytes:
    """One JSON line (ending in ``\\n``) for ``record``.

    Never fails on what a model wrote: a lone surrogate (which UTF-8 cannot hold; the env answered
    it as an error) is written as U+FFFD, and a non-JSON object a trainer put in a message is
    written as ``"<typename>"``. Rewards are finite by the env contract; JSON has no NaN, so a
    NaN a backend reported would be written as ``null`` and refused by :func:`decode_record`.
    """
    try:
        data = _encoder.encode(record)
    except UnicodeEncodeError:
        data = _encoder.encode(_scrub(record))
    return data + b"\n"


def encode_record_into(record: EpisodeRecord | dict[str, Any], buffer: bytearray) -> bytearray:
    """:func:`encode_record` written into ``buffer`` (its content replaced), which is returned.

    The buffer keeps its memory from one record to the next, so a recorder that reuses one
    allocates nothing per record once it has held the largest. That matters where many threads
    record (a vector env runs each sub-env's wrappers on a thread of its own): a fresh buffer per
    record, grown step by step, leaves chunks in every thread's allocator caches.
    """
    try:
        _encoder.encode_into(record, buffer)
    except UnicodeEncodeError:
        _encoder.encode_into(_scrub(record), buffer)
    buffer.extend(b"\n")
    return buffer


def decode_record(line: bytes | str) -> EpisodeRecord:
    """The :class:`EpisodeRecord` of one JSON line; ``msgspec.DecodeError`` (a ``ValueError``)
    names what is wrong with a malformed one."""
    return decode_with(_decoder, line)


def iter_records(path: str | os.PathLike[str]) -> Iterator[EpisodeRecord]:
    """The records of a JSONL file, in order, read line by line.

    One damaged line never costs the rest of the file. A last line without its ``\\n`` is skipped:
    silently while a :class:`~openenv_gym.wrappers.RecordEpisodes` writer is still appending it
    (it holds the file's ``flock`` meanwhile), so this is safe on a file being written; with a
    warning otherwise (the writer died mid-line). A line that is not a record (a torn line that a
    later record ended) is skipped with a warning naming its line number; when a whole record
    follows the torn part on that line (older writers appended the next record to a torn line),
    that record is read.
    """
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                if not _being_written(f):
                    _warn_damaged(path, number, "is cut short (no newline at its end) and no writer is appending "
                                                "to it; skipped")
                return
            if not line.strip():
                continue
            record: EpisodeRecord | None
            try:
                record = decode_record(line)
            except ValueError as exc:  # msgspec.DecodeError
                record = _after_torn_part(line)
                _warn_damaged(path, number, f"is not a record ({exc}); "
                                            + ("read the record after its torn start" if record else "skipped"))
                if record is None:
                    continue
            yield record


_RECORD_START = b'{"env":'  # every record's JSON starts so: "env" is the first field, also in rollout's dicts
_RECOVERY_TRIES = 8


def _after_torn_part(line: bytes) -> EpisodeRecord | None:
    """The whole record at the end of ``line`` after a torn one, if there is one."""
    at = 0
    for _ in range(_RECOVERY_TRIES):
        at = line.find(_RECORD_START, at + 1)
        if at < 0:
            return None
        try:
            return decode_record(line[at:])
        except ValueError:
            continue
    return None


def _being_written(f: Any) -> bool:
    """Whether a writer holds the file's lock (it is appending), or finished a line since it was read."""
    if fcntl is None:
        return True  # no way to tell: take it for a line still being written, as it most often is
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    try:
        return os.fstat(f.fileno()).st_size != f.tell()
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _warn_damaged(path: str | os.PathLike[str], number: int, what: str) -> None:
    warnings.warn(f"openenv_gym: line {number} of {os.fspath(path)} {what}", stacklevel=3)


def read_records(path: str | os.PathLike[str]) -> list[EpisodeRecord]:
    """All complete records of a JSONL file (see :func:`iter_records`)."""
    return list(iter_records(path))


def write_records(path: str | os.PathLike[str], records: Iterable[EpisodeRecord], append: bool = False) -> int:
    """Write ``records`` as JSONL to ``path`` (appending if ``append``); returns how many."""
    n = 0
    with open(Path(path), "ab" if append else "wb") as f:
        for record in records:
            f.write(encode_record(record))
            n += 1
    return n
