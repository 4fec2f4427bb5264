"""Collecting episodes: a policy drives a vector env, first-ready batches, until N episodes are done.

LLM envs are uneven (one step 5 ms, the next 5 s), so the loop never waits for the slowest
sub-env: it sends actions, takes the first ``batch_size`` sub-envs to answer (``recv``), asks
the policy for their next actions in one batch, and sends again. The vector env runs in
SAME_STEP autoreset mode, so a finished sub-env's next episode starts in the same round trip
(send/recv and the autoreset modes: docs/architecture.md, "Vector envs").

Each finished episode can be written as one JSON line (an
:class:`~openenv_gym.records.EpisodeRecord`): the task reference, the tools offered, the
whole conversation, per-turn rewards, terminated/truncated, errors and, when the policy returns
them, each assistant turn's prompt and completion token ids and logprobs. The summary reports
episodes, mean reward, env-steps per second and step-latency percentiles, and how many records
were written.

The output file is opened before anything starts, so a path that cannot be written costs no
server start; a file that already holds records is never truncated by default: a trainer points
several runs at one file and expects to lose none, so ``if_exists="error"`` (the default) refuses
it, ``"append"`` adds to it (a torn last line from a killed run stays on its own line) and
``"overwrite"`` replaces it. An empty file counts as new.

With ``group_size=k`` (GRPO, RLOO, pass@k) the vector env makes groups of ``k`` sub-envs whose
``e``-th episodes share a task (:mod:`openenv_gym.vector.groups`); a group's records are written
together once its ``k`` episodes are done, each with its group-normalised advantage
``(r - mean) / (std + eps)`` (optionally dropping groups whose rewards are all equal: they carry no
learning signal), and the summary adds mean@k and pass@k.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Literal, cast

import gymnasium as gym
import msgspec
import numpy as np
from tqdm import tqdm

from openenv_gym.errors import ConfigurationError
from openenv_gym.policies import Policy, RandomPolicy
from openenv_gym.records import as_assistant_message, encode_record
from openenv_gym.vector.base import AgentVectorEnv, check_num_envs, info_at

__all__ = ["IF_EXISTS", "RolloutSummary", "RunStats", "advantages", "collect", "open_output", "run"]

IF_EXISTS = ("error", "append", "overwrite")
"""What :func:`collect` may do with an output file that already holds records."""

TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "logprobs")
"""Per-assistant-turn lists a policy may return (``Policy.tokens``), copied into each record."""


class RolloutSummary(msgspec.Struct):
    """What a rollout measured."""

    env_id: str
    episodes: int
    num_envs: int
    backend: str
    steps: int
    mean_reward: float
    success_rate: float
    seconds: float
    steps_per_sec: float
    p50_step_ms: float
    p99_step_ms: float
    errors: int
    group_size: int | None = None
    groups: int = 0
    """Complete groups (``group_size`` episodes each on one task)."""
    dropped_groups: int = 0
    """Groups left out because every member got the same reward (``drop_equal``)."""
    mean_at_k: float | None = None
    """Mean reward over the groups' episodes."""
    pass_at_k: float | None = None
    """Fraction of groups in which at least one episode got a reward above 0."""
    written: int = 0
    """Records written to ``out`` (fewer than ``episodes`` when ``drop_equal`` left groups out)."""

    def table(self) -> str:
        rows = [
            ("env", self.env_id), ("backend", f"{self.backend} x {self.num_envs} sub-envs"),
            ("episodes", self.episodes), ("env-steps", self.steps),
            ("mean reward", f"{self.mean_reward:.4f}"), ("reward > 0", f"{self.success_rate:.1%}"),
            ("steps/sec", f"{self.steps_per_sec:.1f}"), ("p50 step", f"{self.p50_step_ms:.2f} ms"),
            ("p99 step", f"{self.p99_step_ms:.2f} ms"), ("errors", self.errors),
            ("wall time", f"{self.seconds:.2f} s"),
        ]
        if self.group_size:
            k = self.group_size
            rows[5:5] = [("groups", f"{self.groups} of {k} ({self.dropped_groups} dropped: equal rewards)"),
                         (f"mean@{k}", f"{self.mean_at_k:.4f}"), (f"pass@{k}", f"{self.pass_at_k:.1%}")]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


_PLACEHOLDER = {"role": "assistant", "content": ""}


class RunStats(msgspec.Struct):
    """What :func:`run` measured: episode returns, step latencies, errors and the groups' figures."""

    returns: list[float]
    latencies: list[float]
    errors: int
    groups: int = 0
    dropped_groups: int = 0
    mean_at_k: float | None = None
    pass_at_k: float | None = None


def advantages(rewards: list[float] | np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Group-normalised advantages, ``(r - mean) / (std + eps)`` (population std, as GRPO uses)."""
    r = np.asarray(rewards, dtype=np.float64)
    return (r - r.mean()) / (r.std() + eps)


class _Groups:
    """Which episode slots of which groups a grouped run plays, and the records waiting for their
    group to complete."""

    def __init__(self, group_size: int, slots: int, drop_equal: bool, eps: float):
        self.k, self.slots, self.drop_equal, self.eps = group_size, slots, drop_equal, eps
        self.allocated: set[tuple[int, int]] = set()
        self.pending: dict[tuple[int, int], list[dict[str, Any]]] = {}
        self.done = self.dropped = 0
        self.means: list[float] = []
        self.passed = 0

    def admit(self, info: dict[str, Any]) -> bool:
        """Whether the episode that ``info`` opened is one this run plays (allocating its slot)."""
        slot = (int(info["group"]), int(info["group_episode"]))
        if slot in self.allocated:
            return True
        if len(self.allocated) < self.slots:
            self.allocated.add(slot)
            return True
        return False

    def finish(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """File a finished episode; the group's records (with advantages) once all ``k`` are in."""
        key = (record["group"], record["group_episode"])
        members = self.pending.setdefault(key, [])
        members.append(record)
        if len(members) < self.k:
            return []
        del self.pending[key]
        rewards = [m["total_reward"] for m in members]
        self.done += 1
        self.means.append(float(np.mean(rewards)))
        self.passed += any(r > 0 for r in rewards)
        if self.drop_equal and max(rewards) == min(rewards):
            self.dropped += 1
            return []
        for member, adv in zip(members, advantages(rewards, self.eps)):
            member["advantage"] = float(adv)
        return sorted(members, key=lambda m: m["env_id"])


def run(
    envs: AgentVectorEnv,
    policy: Policy,
    episodes: int,
    *,
    seed: int | None = 0,
    batch_size: int | None = None,
    on_episode: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = False,
    desc: str = "",
    drop_equal: bool = False,
    eps: float = 1e-6,
) -> RunStats:
    """Drive ``envs`` (SAME_STEP autoreset) with ``policy`` until ``episodes`` episodes end.

    If ``envs`` was made with ``group_size=k``, ``episodes`` must be a multiple of ``k``: the run
    plays ``episodes / k`` whole groups, and ``on_episode`` gets a group's records together, each
    with its ``advantage`` (``drop_equal``: groups whose rewards are all equal are left out).
    """
    n = envs.num_envs
    batch_size = batch_size or max(1, n // 4)
    k = envs.group_size
    groups = None
    if k is not None:
        if episodes % k:
            raise ConfigurationError(f"episodes={episodes} is not a multiple of group_size={k}")
        groups = _Groups(k, episodes // k, drop_equal, eps)
    tokens = getattr(policy, "tokens", None)
    obs, infos = envs.reset(seed=seed)
    records: dict[int, dict[str, Any]] = {}

    def begin(i: int, first: list[Any], info: dict[str, Any]) -> None:
        policy.reset(i, first, info)
        records[i] = {"env_id": i, "task_id": info.get("task_id"), "split": info.get("split"),
                      "index": info.get("index"), "tools": info.get("tools"), "messages": list(first),
                      "rewards": [], "errors": []}
        if "env" in info:  # a mixture names each sub-env's id
            records[i]["env"] = info["env"]
        if groups is not None:
            records[i]["group"], records[i]["group_episode"] = int(info["group"]), int(info["group_episode"])

    def plays(info: dict[str, Any]) -> bool:
        return groups.admit(info) if groups is not None else started < episodes

    started = 0
    active = []
    for i in range(n):
        info = info_at(infos, i)
        if plays(info):
            started += 1
            begin(i, obs[i], info)
            active.append(i)
    returns: list[float] = []
    latencies: list[float] = []
    errors = 0
    sent_at: dict[int, float] = {}

    def send(ids: list[int], observations: list[Any], step_infos: list[dict[str, Any]]) -> None:
        actions = policy.act_batch(ids, observations, step_infos)
        for i, action in zip(ids, actions):
            record = records[i]
            record["messages"].append(as_assistant_message(action))
            if tokens is not None:  # one entry per assistant turn (None where the server sent none)
                got = tokens(i) or {}
                for field in TOKEN_FIELDS:
                    record.setdefault(field, []).append(got.get(field))
        envs.send(actions, ids)
        now = time.perf_counter()
        for i in ids:
            sent_at[i] = now

    def emit(record: dict[str, Any]) -> None:
        for out in (groups.finish(record) if groups is not None else [record]):
            if on_episode is not None:
                on_episode(out)

    resetting: set[int] = set()  # sub-envs whose episode failed: their next result is a reset

    def resend(ids: list[int]) -> None:
        # A failed sub-env resets on its next request whatever the action: no need to ask the policy.
        envs.send([_PLACEHOLDER] * len(ids), ids)
        now = time.perf_counter()
        for i in ids:
            sent_at[i] = now
        resetting.update(ids)

    send(active, [obs[i] for i in active], [info_at(infos, i) for i in active])
    bar = tqdm(total=episodes, disable=not progress, unit="ep", desc=desc, mininterval=0.5)
    try:
        while len(returns) < episodes:
            batch = envs.recv(batch_size)
            now = time.perf_counter()
            again, again_obs, again_infos, failed = [], [], [], []
            for k_, i in enumerate(batch.env_ids.tolist()):
                sent = sent_at.pop(i)
                info = info_at(batch.infos, k_)
                if i in resetting:  # the reset that replaced a failed episode: a new episode or an idle sub-env
                    resetting.discard(i)
                    if "error" in info and not batch.obs[k_]:
                        failed.append(i)
                    elif plays(info):
                        started += 1
                        begin(i, batch.obs[k_], info)
                        again.append(i)
                        again_obs.append(batch.obs[k_])
                        again_infos.append(info)
                    continue
                latencies.append(now - sent)
                record = records[i]
                record["rewards"].append(float(batch.rewards[k_]))
                if "error" in info:
                    errors += 1
                    record["errors"].append(info["error"])
                done = bool(batch.terminations[k_] or batch.truncations[k_])
                record["messages"].extend(info.get("final_obs", []) if done else batch.obs[k_])
                if not done:
                    again.append(i)
                    again_obs.append(batch.obs[k_])
                    again_infos.append(info)
                    continue
                record.update(total_reward=sum(record["rewards"]), terminated=bool(batch.terminations[k_]),
                              truncated=bool(batch.truncations[k_]))
                for field in TOKEN_FIELDS:  # a list of Nones says nothing: leave the field out
                    if field in record and all(x is None for x in record[field]):
                        del record[field]
                returns.append(record["total_reward"])
                bar.update(1)
                emit(record)
                if "error" in info and not batch.obs[k_]:  # no next episode began: reset it first
                    failed.append(i)
                elif plays(info):  # SAME_STEP: batch.obs[k_] is already the next episode's start
                    started += 1
                    begin(i, batch.obs[k_], info)
                    again.append(i)
                    again_obs.append(batch.obs[k_])
                    again_infos.append(info)
            if len(returns) % 16 == 0 and returns:
                bar.set_postfix(mean_reward=f"{np.mean(returns):.3f}", refresh=False)
            if again:
                send(again, again_obs, again_infos)
            if failed and len(returns) < episodes:
                resend(failed)
    finally:
        bar.close()
    stats = RunStats(returns[:episodes], latencies, errors)
    if groups is not None:
        stats.groups, stats.dropped_groups = groups.done, groups.dropped
        stats.mean_at_k = float(np.mean(groups.means)) if groups.means else 0.0
        stats.pass_at_k = groups.passed / groups.done if groups.done else 0.0
    return stats


def open_output(out: str | os.PathLike[str], if_exists: Literal["error", "append", "overwrite"] = "error"
                ) -> IO[bytes]:
    """Open the JSONL file ``out`` for records (binary), checking everything before a run starts.

    ``if_exists`` says what to do with a file that already holds data: ``"error"`` refuses it,
    ``"append"`` adds after its last record, ``"overwrite"`` replaces it. Raises
    :class:`~openenv_gym.errors.ConfigurationError` naming the path and the reason (a missing
    folder, a folder given as the file, no permission).
    """
    if if_exists not in IF_EXISTS:
        raise ConfigurationError(f"if_exists must be one of {', '.join(IF_EXISTS)}, not {if_exists!r}")
    path = Path(out)
    if path.is_dir():
        raise ConfigurationError(f"cannot write episodes to {path}: it is a directory; give a file's path, e.g. {path / 'episodes.jsonl'}")
    try:
        if if_exists == "overwrite":
            return open(path, "wb")
        if if_exists == "append":
            sink = open(path, "ab+")
            try:
                if sink.seek(0, os.SEEK_END):
                    sink.seek(-1, os.SEEK_END)
                    if sink.read(1) != b"\n":  # a run killed mid-line: start the next record on a line of its own
                        sink.write(b"\n")
            except BaseException:
                sink.close()
                raise
            return sink
        try:
            return open(path, "xb")
        except FileExistsError:
            if path.is_file() and path.stat().st_size == 0:
                return open(path, "wb")
            raise ConfigurationError(f"{path} already holds data, which would be lost: --append adds to it, "
                                     "--overwrite replaces it (if_exists='append' or 'overwrite' in Python)") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if isinstance(exc, FileNotFoundError):
            reason = f"its folder {path.parent} does not exist"
        raise ConfigurationError(f"cannot write episodes to {path}: {reason}") from None


def collect(
    env_id: str | Mapping[str, int],
    episodes: int,
    *,
    num_envs: int = 8,
    backend: str = "concurrent",
    policy: str | Policy = "random",
    seed: int = 0,
    batch_size: int | None = None,
    out: str | Path | None = None,
    progress: bool = True,
    make_kwargs: dict[str, Any] | None = None,
    vector_options: dict[str, Any] | None = None,
    group_size: int | None = None,
    drop_equal: bool = False,
    if_exists: Literal["error", "append", "overwrite"] = "error",
) -> RolloutSummary:
    """Collect ``episodes`` episodes of ``env_id`` over ``num_envs`` sub-envs and summarise them.

    Args:
        env_id: a registered id, or a mixture: ``{id: sub-envs}`` (see
            :func:`~openenv_gym.mixture.make_mixture`; ``num_envs`` is then their sum, and each
            record's ``env`` names its id).
        episodes: how many episodes to finish (a multiple of ``group_size`` if given).
        num_envs: sub-envs run at once (capped at ``episodes``; with groups, rounded down to a
            multiple of ``group_size``).
        backend: ``"concurrent"`` or ``"ray"``.
        policy: ``"random"`` or a :class:`~openenv_gym.policies.Policy` (e.g. ``OpenAIPolicy``).
        seed: seeds the sub-envs' task choice and the random policy: a rollout is reproducible.
        batch_size: sub-envs per first-ready batch (default: a quarter of them).
        out: a JSONL file receiving one finished episode per line (opened before anything starts).
        progress: show a progress bar.
        make_kwargs: extra kwargs for ``gym.make_vec`` (e.g. ``split``, ``max_turns``).
        vector_options: backend options (``envs_per_client``, ``num_actors``, ``address``...).
        group_size: play groups of this many episodes per task and record each episode's
            group-normalised ``advantage`` (see :func:`run`).
        drop_equal: with groups, leave out groups whose rewards are all equal.
        if_exists: what to do when ``out`` already holds data: ``"error"`` (refuse, the default),
            ``"append"`` or ``"overwrite"`` (see :func:`open_output`).
    """
    if isinstance(env_id, Mapping):
        num_envs = sum(env_id.values())
    num_envs = check_num_envs(num_envs)  # the same rule, and words, as gym.make_vec's
    if isinstance(episodes, (bool, np.bool_)) or not isinstance(episodes, (int, np.integer)) or episodes < 1:
        raise ConfigurationError(f"episodes must be a positive integer, not {episodes!r}")
    num_envs = min(num_envs, int(episodes))
    if group_size is not None:
        if isinstance(group_size, (bool, np.bool_)) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
            raise ConfigurationError(f"group_size must be a positive integer, not {group_size!r}")
        group_size = int(group_size)
        if episodes % group_size:
            raise ConfigurationError(f"episodes={episodes} is not a multiple of group_size={group_size}")
        num_envs = max(group_size, num_envs - num_envs % group_size)
    # Before any server starts: a bad path fails here, with nothing to clean up.
    sink = open_output(out, if_exists) if out is not None else None
    written = 0
    envs: AgentVectorEnv
    try:
        if isinstance(env_id, Mapping):
            from openenv_gym.mixture import make_mixture

            envs = make_mixture(env_id, backend=backend, autoreset_mode="SameStep", vector_options=vector_options,
                                group_size=group_size, **(make_kwargs or {}))
            env_id = "+".join(env_id)
        else:
            # An openenv_gym id's vector entry point builds an AgentVectorEnv.
            envs = cast(AgentVectorEnv, gym.make_vec(env_id, num_envs=num_envs, backend=backend, autoreset_mode="SameStep",
                                                     vector_options=vector_options, group_size=group_size, **(make_kwargs or {})))
    except BaseException:
        if sink is not None:
            sink.close()
        raise
    agent: Policy = RandomPolicy(seed=seed) if policy == "random" else policy  # type: ignore[assignment]

    def write(record: dict[str, Any]) -> None:
        nonlocal written
        if sink is not None:  # one line per episode, an EpisodeRecord's fields
            sink.write(encode_record({"env": env_id, **record}))
            written += 1

    start = time.perf_counter()
    try:
        stats = run(envs, agent, episodes, seed=seed, batch_size=batch_size, on_episode=write,
                    progress=progress, desc=env_id, drop_equal=drop_equal)
    finally:
        try:
            envs.close()
        finally:
            if sink is not None:
                sink.close()
            if agent is not policy:
                agent.close()
    seconds = time.perf_counter() - start
    returns, latencies = stats.returns, stats.latencies
    lat_ms = np.array(latencies) * 1000 if latencies else np.zeros(1)
    return RolloutSummary(
        env_id=env_id, episodes=len(returns), num_envs=num_envs, backend=backend, steps=len(latencies),
        mean_reward=float(np.mean(returns)) if returns else 0.0,
        success_rate=float(np.mean([r > 0 for r in returns])) if returns else 0.0,
        seconds=seconds, steps_per_sec=len(latencies) / seconds if seconds else 0.0,
        p50_step_ms=float(np.percentile(lat_ms, 50)), p99_step_ms=float(np.percentile(lat_ms, 99)),
        errors=stats.errors, group_size=group_size, groups=stats.groups, dropped_groups=stats.dropped_groups,
        mean_at_k=stats.mean_at_k, pass_at_k=stats.pass_at_k, written=written,
    )
