"""RecordEpisodes: every finished episode of an env, written as one JSON line a trainer reads.

The line is an :class:`~openenv_gym.records.EpisodeRecord` (the same record a rollout writes):
the task reference, the tools offered, the whole conversation, per-turn rewards, how the episode
ended, its errors, and each assistant turn's token ids when
:class:`~openenv_gym.wrappers.ChatTokens` (below this wrapper) provides them. The file can be read
while it grows and rotates by size, so a trainer can tail it from another process.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import threading
import warnings
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym
from gymnasium.utils import RecordConstructorArgs

from openenv_gym.errors import ConfigurationError
from openenv_gym.records import EpisodeRecord, encode_record_into
from openenv_gym.wrappers.conversation import new_messages, sent_message

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; one writer per path there
    fcntl = None  # type: ignore[assignment]

__all__ = ["RecordEpisodes", "JsonlWriter"]

_TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "logprobs")


class JsonlWriter:
    """Appends lines to a file, each with one ``write`` call, rotating it by size; any number of
    writers, in any number of threads and processes, may share one path.

    A reader that reads whole lines (:func:`~openenv_gym.records.iter_records`) never sees part of
    a record: a line is handed to the kernel in one ``write`` on a file opened with ``O_APPEND``
    (no buffer in this process holds half of it), and rotation renames files, so a reader that has
    the old file open keeps reading it to its end.

    Sharing a path: a vector env's sub-envs each wrap their own ``RecordEpisodes`` around the same
    path, in this process's threads, in host processes or in Ray actors on this machine. Every
    append and every rotation holds an exclusive ``flock`` on the file at ``path``; under it the
    writer checks that its descriptor is still that file (another writer may have rotated it
    away, then it opens the new one) and reads the file's real size, so the writers rotate once,
    together, at ``max_bytes``, and no line lands in a file that was already renamed or deleted.
    (Without ``fcntl``, on Windows, writers are not serialised: one writer per path there.)

    Rotation (``max_bytes`` set): before a line that would take the file over ``max_bytes``, the
    file is renamed ``<path>.1`` (``.1`` to ``.2`` and so on first, up to ``backups``; the
    oldest beyond that is deleted; with ``backups=0`` the full file is deleted) and a new file is
    started. A single line longer than ``max_bytes`` gets a file of its own.

    A failed write (a full disk, a file size limit) raises ``OSError`` and leaves the file as it
    was: whatever part of the line reached the file is cut off again. A line cut short anyway (a
    writer killed mid-``write``) is ended by the next writer before its own line, so it costs
    only itself (the reader skips it with a warning) and never the record after it.
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int | None = None, backups: int = 5):
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
            raise ConfigurationError(f"max_bytes must be a positive integer or None, not {max_bytes!r}")
        if isinstance(backups, bool) or not isinstance(backups, int) or backups < 0:
            raise ConfigurationError(f"backups must be a non-negative integer, not {backups!r}")
        self.path = Path(os.path.abspath(path))  # the same file whatever the cwd is later
        self.max_bytes = max_bytes
        self.backups = backups
        self._closed = False
        self._fd: int | None = self._open()
        # flock excludes other descriptors only: threads sharing this writer take turns here.
        self._mutex = threading.Lock()

    def _open(self) -> int:
        # Read access too: the last byte is read to see whether a line was left unfinished. A new
        # file is its user's alone (0600): records hold the runs' model text and tokens.
        return os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, line: bytes | bytearray) -> None:
        """Append ``line`` (which must end with a newline), rotating first if it would not fit.

        Raises ``OSError`` when the file cannot take it (the file is then left as it was), and
        ``ValueError`` once closed.
        """
        with self._mutex:
            while True:
                fd = self._lock_current()
                try:
                    size = os.fstat(fd).st_size
                    if self.max_bytes is not None and size > 0 and size + len(line) > self.max_bytes:
                        self._rotate()  # the locked file goes; the next round opens the new one
                        continue
                    self._append(fd, size, line)
                    return
                finally:
                    _unlock(fd)

    def _lock_current(self) -> int:
        """Our descriptor of the file now at ``path``, locked (reopened if it was rotated away)."""
        while True:
            if self._closed:
                raise ValueError(f"the record file {self.path.name} is closed")
            if self._fd is None:  # the last reopen failed (a full disk, no descriptor left): try again
                self._fd = self._open()
            fd = self._fd
            _lock(fd)
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                now = None
            held = os.fstat(fd)
            if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                return fd
            self._fd = None
            os.close(fd)  # releases the lock too
            self._fd = self._open()

    def _append(self, fd: int, size: int, line: bytes | bytearray) -> None:
        data = line
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + line  # a writer died mid-line: end that line, so it costs only itself
        view = memoryview(data)
        try:
            while view:  # a regular file takes the whole line in one call; the loop is for the rare short write
                written = os.write(fd, view)
                view = view[written:]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)  # no half line left for the next record to be appended to
            raise

    def _rotate(self) -> None:
        """Rename (or delete) the file at ``path``; the caller holds its lock."""
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
            return
        # Shift only the backups there are (.1 up to the first gap): a rotation costs what is
        # kept, not ``backups`` look-ups. A full set loses its oldest, overwritten by the next.
        kept = 0
        while kept < self.backups and self._backup(kept + 1).exists():
            kept += 1
        for n in range(min(kept, self.backups - 1), 0, -1):
            os.replace(self._backup(n), self._backup(n + 1))
        os.replace(self.path, self._backup(1))

    def _backup(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{n}")

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._mutex:
            self._closed = True
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)


def _lock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)


def _unlock(fd: int) -> None:
    if fcntl is not None:
        with contextlib.suppress(OSError):  # a descriptor closed while locked is unlocked already
            fcntl.flock(fd, fcntl.LOCK_UN)


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

    Many recorders may share one path: the sub-envs of a vector env given
    ``env_wrappers=[functools.partial(RecordEpisodes, path=...)]``, in threads, host processes
    or Ray actors on one machine. Their writers append and rotate under the file's lock (see
    :class:`JsonlWriter`), so no record is lost and no file outgrows ``max_bytes``.

    Recording never costs the caller a result: if writing fails (a full disk, a file size limit),
    ``step`` returns the inner env's result with ``info["record_error"]`` (``{"type",
    "message"}``) and warns; that episode is not written, and the file is left as it was, so
    every record before it stays readable and the next one is written whole.

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
        self._line = bytearray()  # reused for every record (see encode_record_into)
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
        try:
            self._record = self._start(obs, info, seed, options)
        except Exception as exc:  # a recorder failure never costs the caller the reset's result
            info = self._failed(info, exc, "this episode is not recorded")
        return obs, info

    def _start(self, obs: Any, info: dict[str, Any], seed: int | None,
               options: dict[str, Any] | None) -> EpisodeRecord:
        spec = getattr(self.env.unwrapped, "spec", None)
        task = (options or {}).get("task")
        tools = info.get("tools")
        return EpisodeRecord(
            env=getattr(spec, "id", None),
            task_id=_str_or_none(info.get("task_id")),
            split=_str_or_none(info.get("split")),
            index=_int_or_none(info.get("index")),
            task=dict(task) if isinstance(task, dict) else None,
            seed=_int_or_none(seed),
            tools=list(tools) if isinstance(tools, list) else None,
            messages=new_messages(obs, info),
        )

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the inner env; write the episode if this step ended it.

        If recording fails (a full disk, a file size limit, a removed directory), the step's
        result is returned all the same, with ``info["record_error"]`` (``{"type", "message"}``)
        and a warning; that episode is not written, and every record already written stays whole.
        """
        obs, reward, terminated, truncated, info = self.env.step(action)
        record = self._record
        if record is None:  # stepping an episode this wrapper did not see start (the inner env decides)
            return obs, reward, terminated, truncated, info
        try:
            self._add_step(record, action, obs, reward, terminated, truncated, info)
        except Exception as exc:  # a recorder failure never costs the caller the step's result
            self._record = None
            info = self._failed(info, exc, "the episode is not recorded")
        return obs, reward, terminated, truncated, info

    def _add_step(self, record: EpisodeRecord, action: Any, obs: Any, reward: SupportsFloat,
                  terminated: bool, truncated: bool, info: dict[str, Any]) -> None:
        record.messages.append(sent_message(action, info))
        record.messages.extend(new_messages(obs, info))
        record.rewards.append(float(reward))
        if isinstance(info.get("error"), dict):
            record.errors.append(dict(info["error"]))
        self._add_tokens(record, info.get("turn_tokens"))
        if terminated or truncated:
            self._record = None
            record.total_reward = float(sum(record.rewards))
            record.terminated, record.truncated = bool(terminated), bool(truncated)
            self._writer.write(encode_record_into(record, self._line))
            self.episodes += 1

    def _failed(self, info: dict[str, Any], exc: Exception, consequence: str) -> dict[str, Any]:
        """``info`` with ``record_error`` set, after a warning that says what failed."""
        error = {"type": type(exc).__name__, "message": str(exc)}
        try:
            warnings.warn(f"openenv_gym: recording to {self.path} failed ({error['type']}: {error['message']}); "
                          f"{consequence}", stacklevel=3)
        except Exception:  # warnings turned into errors: info["record_error"] still says it
            pass
        return {**info, "record_error": error}

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
