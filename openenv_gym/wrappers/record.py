"""RecordEpisodes: every finished episode of an env, written as one JSON line a trainer reads.

The line is an :class:`~openenv_gym.records.EpisodeRecord` (the same record a rollout writes):
the task reference, the tools offered, the whole conversation, per-turn rewards, how the episode
ended, its errors, and each assistant turn's token ids when
:class:`~openenv_gym.wrappers.ChatTokens` (below this wrapper) provides them. The file can be read
while it grows and rotates by size, so a trainer can tail it from another process.
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym
from gymnasium.utils import RecordConstructorArgs

from openenv_gym.errors import ConfigurationError
from openenv_gym.records import EpisodeRecord, encode_record
from openenv_gym.wrappers.conversation import new_messages, sent_message

__all__ = ["RecordEpisodes", "JsonlWriter"]

_TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "logprobs")


class JsonlWriter:
    """Appends lines to a file, each with one ``write`` call, rotating it by size.

    A reader that reads whole lines (:func:`~openenv_gym.records.iter_records`) never sees part of
    a record: a line is handed to the kernel in one ``write`` on a file opened with ``O_APPEND``
    (no buffer in this process holds half of it), and rotation renames files, so a reader that has
    the old file open keeps reading it to its end. One writer per path: two writers on the same
    file would interleave lines safely but rotate it twice.

    Rotation (``max_bytes`` set): before a line that would take the file over ``max_bytes``, the
    file is renamed ``<path>.1`` (``.1`` to ``.2`` and so on first, up to ``backups``; the
    oldest beyond that is deleted; with ``backups=0`` the full file is deleted) and a new file is
    started. A single line longer than ``max_bytes`` gets a file of its own.
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int | None = None, backups: int = 5):
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
            raise ConfigurationError(f"max_bytes must be a positive integer or None, not {max_bytes!r}")
        if isinstance(backups, bool) or not isinstance(backups, int) or backups < 0:
            raise ConfigurationError(f"backups must be a non-negative integer, not {backups!r}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self._fd: int | None = None
        self._size = 0
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._size = os.fstat(self._fd).st_size

    @property
    def closed(self) -> bool:
        return self._fd is None

    def write(self, line: bytes) -> None:
        """Append ``line`` (which must end with a newline), rotating first if it would not fit."""
        if self._fd is None:
            raise ValueError(f"the record file {self.path.name} is closed")
        if self.max_bytes is not None and self._size > 0 and self._size + len(line) > self.max_bytes:
            self._rotate()
        view = memoryview(line)
        while view:  # a regular file takes the whole line in one call; the loop is for the rare short write
            written = os.write(self._fd, view)
            view = view[written:]
        self._size += len(line)

    def _rotate(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            for n in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{n}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._open()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


class RecordEpisodes(gym.Wrapper, RecordConstructorArgs):
    """Write every finished episode as an :class:`~openenv_gym.records.EpisodeRecord` JSON line.

    An episode is written when a step returns ``terminated`` or ``truncated``. An episode cut short
    (by ``reset`` before it ended, by ``close``, or by an exception from the inner env) is not
    written: it is not a complete sample. The record holds:

    * ``env`` (the Gymnasium id, if the env has a spec), ``task_id``, ``split``, ``index``, and
      ``task`` when an explicit task spec was passed to ``reset``; ``seed`` when ``reset`` got
      one. ``record.reset_options()`` plays the same task again.
    * ``tools``: ``info["tools"]`` at reset.
    * ``messages``: the opening messages, then per step the agent's turn (the message the env
      below understood: ``info["assistant_message"]`` when a wrapper below rewrote the action,
      else the action normalised by :func:`~openenv_gym.records.as_assistant_message`) and the
      step's new messages (``info["new_messages"]`` when a wrapper below changed the
      observation). ``record.actions()`` are the assistant messages, to replay the episode.
    * ``rewards`` (one per step), ``total_reward``, ``terminated``, ``truncated``, and ``errors``
      (every ``info["error"]``).
    * ``prompt_token_ids``, ``completion_token_ids``, ``logprobs``: one entry per step from
      ``info["turn_tokens"]`` (set by :class:`~openenv_gym.wrappers.ChatTokens` below this
      wrapper); ``None`` when no step had any.

    Nothing else from ``info`` is recorded, and never the env's constructor arguments, so a record
    holds no secret the conversation does not already hold.

    Args:
        env: an env following the openenv_gym contract (or a wrapper of one).
        path: the JSONL file (appended to if it exists).
        max_bytes: rotate the file before it would exceed this size (``None``: never rotate, the
            default, so no recorded episode is ever deleted).
        backups: rotated files kept (``<path>.1`` newest ... ``<path>.<backups>`` oldest).

    The file is closed by :meth:`close` (which also closes the inner env). :attr:`episodes`
    counts the records written.

    Example:
        >>> import gymnasium as gym, openenv_gym, tempfile, os
        >>> from openenv_gym.records import read_records
        >>> from openenv_gym.wrappers import RecordEpisodes
        >>> path = os.path.join(tempfile.mkdtemp(), "episodes.jsonl")
        >>> env = RecordEpisodes(gym.make("openenv/Arithmetic-v0"), path)
        >>> obs, info = env.reset(seed=0)
        >>> call = {"type": "function", "function": {"name": "submit", "arguments": '{"answer": "0"}'}}
        >>> _ = env.step({"role": "assistant", "tool_calls": [call]})
        >>> env.close()
        >>> [record] = read_records(path)
        >>> record.env, record.terminated, [m["role"] for m in record.messages]
        ('openenv/Arithmetic-v0', True, ['user', 'assistant', 'tool'])
    """

    def __init__(
        self,
        env: gym.Env,
        path: str | os.PathLike[str],
        max_bytes: int | None = None,
        backups: int = 5,
    ):
        RecordConstructorArgs.__init__(self, path=str(path), max_bytes=max_bytes, backups=backups)
        gym.Wrapper.__init__(self, env)
        self._writer = JsonlWriter(path, max_bytes=max_bytes, backups=backups)
        self._record: EpisodeRecord | None = None
        self.episodes = 0

    @property
    def path(self) -> Path:
        return self._writer.path

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the inner env and start recording the new episode (an unfinished one is dropped)."""
        self._record = None
        obs, info = self.env.reset(seed=seed, options=options)
        spec = getattr(self.env.unwrapped, "spec", None)
        task = (options or {}).get("task")
        index = info.get("index")
        tools = info.get("tools")
        self._record = EpisodeRecord(
            env=getattr(spec, "id", None),
            task_id=_str_or_none(info.get("task_id")),
            split=_str_or_none(info.get("split")),
            index=_int_or_none(index),
            task=dict(task) if isinstance(task, dict) else None,
            seed=_int_or_none(seed),
            tools=list(tools) if isinstance(tools, list) else None,
            messages=new_messages(obs, info),
        )
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the inner env; write the episode if this step ended it."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        record = self._record
        if record is None:  # stepping an episode this wrapper did not see start (the inner env decides)
            return obs, reward, terminated, truncated, info
        record.messages.append(sent_message(action, info))
        record.messages.extend(new_messages(obs, info))
        record.rewards.append(float(reward))
        if isinstance(info.get("error"), dict):
            record.errors.append(dict(info["error"]))
        self._add_tokens(record, info.get("turn_tokens"))
        if terminated or truncated:
            record.total_reward = float(sum(record.rewards))
            record.terminated, record.truncated = bool(terminated), bool(truncated)
            self._writer.write(encode_record(record))
            self.episodes += 1
            self._record = None
        return obs, reward, terminated, truncated, info

    @staticmethod
    def _add_tokens(record: EpisodeRecord, tokens: Any) -> None:
        steps = len(record.rewards)
        for field in _TOKEN_FIELDS:
            value = tokens.get(field) if isinstance(tokens, dict) else None
            column = getattr(record, field)
            if value is None and column is None:
                continue
            if column is None:  # the first turn with this field: earlier turns had none
                column = [None] * (steps - 1)
                setattr(record, field, column)
            column.append(None if value is None else list(value))

    def close(self) -> None:
        """Close the record file, then the inner env."""
        self._record = None
        try:
            self._writer.close()
        finally:
            super().close()


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
