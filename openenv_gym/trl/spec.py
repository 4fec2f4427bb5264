"""EnvSpec: any openenv_gym id (or a weighted mixture of ids) as the three things TRL's GRPOTrainer takes.

TRL (1.16) trains agents through ``environment_factory``: an environment is a class whose public
methods are the model's tools, ``reset(**row)`` returns text TRL appends to the row's prompt, and
an optional ``get_reward()`` scores the finished rollout. TRL ships
``trl.experimental.openreward.OpenRewardSpec`` for one ORS env; :class:`EnvSpec` has the same
members with the same meanings, for every env openenv_gym plays (ORS, Verifiers, Fleet, OpenEnv,
hosted or isolated) and for mixtures of them::

    spec = EnvSpec("openenv/Arithmetic-v0", num_tasks=256)
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=spec.train_dataset,
                          environment_factory=spec.environment_factory, reward_funcs=spec.reward_funcs)

The conventions follow ``OpenRewardSpec``'s:

* ``train_dataset``: one row per task, from the env's task API: ``split``, ``index`` and a
  ``prompt`` that is an empty user message; TRL passes the whole row to ``reset``, which starts
  that task and returns its prompt text, so the prompt is never doubled. No column holds a task
  spec, so none holds an answer.
* ``environment_factory``: a class per env (TRL collects tools from the class, with
  ``inspect.getmembers(type(env), inspect.isfunction)``), whose tool methods are written from the
  env's tool schemas (:mod:`openenv_gym.trl.tools`); each instance is one leased slot of the id's
  :class:`~openenv_gym.pool.SessionPool` (the shards vector envs use), so hundreds of instances
  share one server and a few connection pools, and start no thread.
* Rewards, counted once: an env whose agent acts through tools (ORS, Fleet, OpenEnv) owns its
  reward, and its class has ``get_reward()`` (the episode's total, which TRL adds as a reward
  source named after the class); an env whose agent answers in plain text (Verifiers, or any env
  without tools) is scored by ``reward_funcs``, which plays the model's final message through the
  env as the assistant's turn. The other source gives ``None`` for a rollout (TRL ignores it).
* A mapping ``{id: weight}`` gives TRL's dict form: ``environment_factory`` is a dict of classes
  keyed by id, and each dataset row names its env in ``environment``.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any

import gymnasium as gym

from openenv_gym import backends, runtime
from openenv_gym.errors import ConfigurationError, OpenEnvGymError
from openenv_gym.pool import SessionPool, Slot
from openenv_gym.registration import ENTRY_POINT, check_id, check_make_kwargs
from openenv_gym.trl.tools import check_names, schema_loss, tool_function
from openenv_gym.wire import UNBOUNDED_TASKS, Message

__all__ = ["EnvSpec", "Environment", "env_reward"]

_ENDED = "The episode has ended; this tool call was not run."


class EnvSpec:
    """One spec object that wires any openenv_gym env, or a weighted mixture, into TRL's GRPOTrainer.

    Args:
        id_or_mapping: a registered id (``"openenv/Arithmetic-v0"``), or a mapping of ids to
            weights (``{"openenv/Arithmetic-v0": 3, "openenv/MyVerifiersEnv-v0": 1}``).
        split: the split the dataset's tasks come from: a name for every id, a mapping of ids to
            names (a mixture of envs whose splits differ), or ``None`` (the default): each env's
            own, as ``gym.make`` picks it (its ``train`` split, else its first: an OpenEnv env
            offers only ``default``).
        num_tasks: how many rows (``None``: every task of the split). For a mixture, the total,
            shared by weight.
        indices: these task indices of ``split`` (one id only; not with ``num_tasks``).
        **env_kwargs: what ``gym.make(id, ...)`` takes (``max_turns``, ``step_timeout``,
            ``python``, ``isolate``, the adapter's kwargs), for every id of a mixture.

    Rows of a mixture: env ``k`` of weight share ``p_k`` gets ``round(T * p_k)`` rows (largest
    remainders, so they add up to ``T``), ``T`` being ``num_tasks``, or else the smallest total in
    which every env's every task appears. An env with fewer tasks than its rows repeats them in
    order; the rows of all envs are interleaved evenly.

    Close the spec when done (``close()`` or ``with``): it stops the servers and hosts its envs
    started; one left open is closed at interpreter exit.
    """

    def __init__(self, id_or_mapping: str | Mapping[str, float], *, split: str | Mapping[str, str] | None = None,
                 num_tasks: int | None = None, indices: Sequence[int] | None = None, **env_kwargs: Any):
        if num_tasks is not None and indices is not None:
            raise ConfigurationError("give num_tasks or indices, not both")
        if num_tasks is not None and (isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1):
            raise ConfigurationError(f"num_tasks must be a positive integer, not {num_tasks!r}")
        if isinstance(id_or_mapping, str):
            weights = {id_or_mapping: 1.0}
            self.mixture = False
        elif isinstance(id_or_mapping, Mapping):
            weights = {}
            for key, weight in id_or_mapping.items():
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                        or weight <= 0:
                    raise ConfigurationError(f"the weight of {key!r} must be a positive number, not {weight!r}")
                weights[key] = float(weight)
            if not weights:
                raise ConfigurationError("the mapping names no environment")
            if indices is not None:
                raise ConfigurationError("indices= picks the tasks of one env; a mixture takes num_tasks=")
            self.mixture = True
        else:
            raise ConfigurationError(f"EnvSpec takes an id or a mapping of ids to weights, not "
                                     f"{type(id_or_mapping).__name__}")
        if isinstance(split, Mapping):
            unknown = sorted(set(split) - set(weights))
            if unknown:
                raise ConfigurationError(f"split= names ids the spec does not hold: {', '.join(unknown)}")
            splits: dict[str, str | None] = {id: split.get(id) for id in weights}
            bad = sorted(id for id, name in splits.items() if name is not None and not isinstance(name, str))
            if bad:
                raise ConfigurationError(f"split= maps ids to split names (strings); not so for {', '.join(bad)}")
        elif split is None or isinstance(split, str):
            splits = dict.fromkeys(weights, split)
        else:
            raise ConfigurationError(f"split must be a name, a mapping of ids to names, or None; not {type(split).__name__}")
        self.split = split
        self.num_tasks = num_tasks
        self.indices = None if indices is None else [int(i) for i in indices]
        self.weights = weights
        self._envs = {id: _Env(id, splits[id], env_kwargs) for id in weights}  # every name checked before anything starts

    # -- the three members TRL takes ---------------------------------------------------------------
    @cached_property
    def train_dataset(self) -> Any:
        """A ``datasets.Dataset`` of the tasks to train on: ``prompt`` (an empty user message: TRL
        appends what ``reset`` returns), ``split``, ``index`` and, for a mixture, ``environment``."""
        from datasets import Dataset

        # A mixture shares num_tasks out by weight; an endless env of one takes at most that many.
        plan = {id: env.indices(self.num_tasks if not self.mixture else None, self.indices, endless=self.num_tasks)
                for id, env in self._envs.items()}
        if self.mixture:
            rows = _mix({id: (self.weights[id], plan[id]) for id in plan}, self.num_tasks)
        else:
            rows = [(next(iter(plan)), i) for i in next(iter(plan.values()))]
        columns: dict[str, list[Any]] = {
            "prompt": [[{"role": "user", "content": ""}] for _ in rows],
            "split": [self._envs[id].split for id, _ in rows],
            "index": [i for _, i in rows],
        }
        if self.mixture:
            columns["environment"] = [id for id, _ in rows]
        return Dataset.from_dict(columns)

    @cached_property
    def environment_factory(self) -> type[Environment] | dict[str, type[Environment]]:
        """The environment class (one instance per rollout slot), or for a mixture a dict of them
        keyed by id, as ``environment_factory=`` takes it. Starts each env's first adapter (a local
        source launches its server here)."""
        classes = {id: env.environment_class() for id, env in self._envs.items()}
        return classes if self.mixture else next(iter(classes.values()))

    @property
    def reward_funcs(self) -> list[Callable[..., list[float | None]]]:
        """``[env_reward]`` when an env answers in plain text (it scores those rollouts), else ``[]``:
        envs with tools score through ``get_reward``, which TRL adds itself."""
        return [env_reward] if any(env.answers_in_text for env in self._envs.values()) else []

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        """End every episode and stop the servers and hosts the envs started. Idempotent."""
        for env in self._envs.values():
            env.close()

    def __enter__(self) -> EnvSpec:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        what = ", ".join(f"{id}: {w:g}" for id, w in self.weights.items()) if self.mixture else next(iter(self.weights))
        return f"EnvSpec({what}, split={self.split!r})"


class _Env:
    """One id of a spec: its adapter recipe, its pool of slots, its environment class."""

    def __init__(self, id: str, split: str | None, env_kwargs: dict[str, Any]):
        check_id(id)
        spec = gym.spec(id)
        if spec.entry_point != ENTRY_POINT:
            raise ConfigurationError(f"{id} is not an openenv_gym environment (its entry point is "
                                     f"{spec.entry_point!r})")
        check_make_kwargs(id, env_kwargs, vector=True)  # before anything starts
        self.id, self._split = id, split
        self.entry = str({**(spec.kwargs or {}), **env_kwargs}.get("adapter") or "")
        self._pool_kwargs = {k: v for k, v in env_kwargs.items() if k not in ("render_mode", "split")}
        self._pool: SessionPool | None = None
        self._class: type[Environment] | None = None
        self._lock = threading.Lock()

    @property
    def pool(self) -> SessionPool:
        """The id's slots, started (its first adapter, or host, is up)."""
        with self._lock:
            if self._pool is None:  # every reset names its split (the dataset's)
                self._pool = SessionPool(self.id, **self._pool_kwargs)
            return self._pool

    @cached_property
    def kind(self) -> str:
        """The backend's kind (``ors``, ``verifiers``...), from its descriptor."""
        return backends.kind_of_adapter(self.entry) or self.entry.partition(":")[0].rsplit(".", 1)[-1]

    @property
    def answers_in_text(self) -> bool:
        """Whether the agent's answer is a plain-text message (Verifiers), rather than a tool call."""
        return self.kind.startswith("verifiers") or not self.pool.tools

    @cached_property
    def split(self) -> str:
        """The split the id's rows come from: the one given, else the env's own (``train``, else its first)."""
        if self._split is not None:
            return self._split
        names = [s.name for s in runtime.run_sync(self.pool.splits())]
        if not names:
            raise ConfigurationError(f"{self.id} offers no split to take tasks from")
        return next((n for n in names if n == "train"), names[0])

    def indices(self, num_tasks: int | None, indices: list[int] | None, endless: int | None = None) -> list[int]:
        split = self.split
        n = runtime.run_sync(self.pool.num_tasks(split))
        if indices is not None:
            bad = [i for i in indices if not 0 <= i < n]
            if bad:
                raise ConfigurationError(f"{self.id}: indices {bad[:5]} are outside split {split!r} (0..{n - 1})")
            return list(indices)
        if n == 0:
            raise ConfigurationError(f"{self.id}: split {split!r} has no tasks")
        if n == UNBOUNDED_TASKS and num_tasks is None:
            if endless is not None:
                return list(range(endless))
            raise ConfigurationError(f"{self.id}: split {split!r} never ends (task k is seed k): pass num_tasks= "
                                     "for the rows to train on")
        return list(range(n if num_tasks is None else min(n, num_tasks)))

    def environment_class(self) -> type[Environment]:
        with self._lock:
            if self._class is not None:
                return self._class
        pool = self.pool
        tools = pool.tools
        check_names(tools, self.id)
        for spec in tools:
            lost = schema_loss(spec)
            if lost:
                warnings.warn(f"{self.id}: the schema of tool {spec.name!r} has parts a Python signature cannot "
                              f"carry, so the model does not see them ({'; '.join(lost)})", stacklevel=4)
        name = _class_name(self.id)
        namespace: dict[str, Any] = {"_pool": pool, "_env_id": self.id, "_split": self.split, "__module__": __name__,
                                     "__doc__": f"{self.id} for TRL: one rollout slot; its methods are the env's tools."}
        for spec in tools:
            fn = tool_function(spec, Environment._call_tool)
            fn.__qualname__ = f"{name}.{spec.name}"
            namespace[spec.name] = fn
        bases: tuple[type, ...] = (TextAnswer,) if self.answers_in_text else (ToolReward,)
        cls = type(name, bases, namespace)
        with self._lock:
            self._class = cls
        return cls

    def close(self) -> None:
        with self._lock:
            pool = self._pool
        if pool is not None:
            pool.close()


def _class_name(id: str) -> str:
    """``openenv/Arithmetic-v0`` -> ``Arithmetic``: TRL names the class's reward column after it."""
    name = re.sub(r"-v\d+$", "", id.rsplit("/", 1)[-1])
    name = re.sub(r"\W", "_", name)
    return name if name.isidentifier() else f"Env_{name}"


def _mix(parts: dict[str, tuple[float, list[int]]], total: int | None) -> list[tuple[str, int]]:
    """Rows ``(id, index)`` of a weighted mixture (see :class:`EnvSpec`), interleaved evenly."""
    weight = sum(w for w, _ in parts.values())
    share = {id: w / weight for id, (w, _) in parts.items()}
    if total is None:
        total = max(math.ceil(len(idx) / share[id] - 1e-9) for id, (_, idx) in parts.items())
    exact = {id: total * p for id, p in share.items()}
    counts = {id: math.floor(x) for id, x in exact.items()}
    for id in sorted(exact, key=lambda k: exact[k] - counts[k], reverse=True)[:total - sum(counts.values())]:
        counts[id] += 1
    placed = []
    for order, (id, (_, idx)) in enumerate(parts.items()):
        n = counts[id]
        placed += [((j + 0.5) / n, order, id, idx[j % len(idx)]) for j in range(n)]
    return [(id, i) for _, _, id, i in sorted(placed)]


def _text(messages: list[Message]) -> str:
    """The text of ``messages``, as TRL appends it to a prompt or shows it as a tool's result."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if content:
            parts.append(str(content))
    return "\n\n".join(parts)


class Environment:
    """One rollout slot of an env, as TRL's ``environment_factory`` makes it (one class per env).

    Its public methods are what TRL reads: ``reset`` and the env's tools (and ``get_reward`` for
    an env with tools). What else a trainer may read is in attributes: ``reward`` (the episode's
    total so far), ``done`` (it terminated or was truncated), ``error`` (why the episode failed,
    or ``None``), ``info`` (the env's info at reset). Calls on one instance are one at a time
    (:class:`~openenv_gym.errors.ConcurrentUse` otherwise); different instances run concurrently.
    """

    _pool: SessionPool
    _env_id: str
    _split: str

    def __init__(self) -> None:
        self._slot: Slot = self._pool.lease()
        weakref.finalize(self, _release, self._slot)
        self.reward = 0.0
        self.done = False
        self.error: str | None = None
        self.info: dict[str, Any] = {}
        self._started = False
        self._calls = 0

    def reset(self, **row: Any) -> str:
        """Start the row's task (its ``index`` in its ``split``, by default the spec's; other columns
        are ignored) and return its prompt: the text of the env's opening messages."""
        if "index" not in row:
            raise ConfigurationError(f"{self._env_id}: reset() needs the dataset row's 'index' (and 'split'); "
                                     "use EnvSpec.train_dataset, or give your dataset these columns")
        split = row.get("split") or self._split
        self.reward, self.done, self.error, self._started, self._calls = 0.0, False, None, False, 0
        options = {"split": str(split), "index": int(row["index"])}
        try:
            obs, self.info = runtime.run_sync(self._slot.reset(options=options))
        except OpenEnvGymError as exc:
            if isinstance(exc, ConfigurationError):
                raise
            # Once more, on a recreated session: a local server that died is relaunched then.
            obs, self.info = runtime.run_sync(self._slot.reset(options=options))
        self._started = True
        return _text(obs)

    def _step(self, action: Any) -> str:
        try:
            obs, reward, terminated, truncated, _ = runtime.run_sync(self._slot.step(action))
        except OpenEnvGymError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            raise
        self.reward += reward
        self.done = terminated or truncated
        return _text(obs)

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call of the model's as the env's step; its result text."""
        if not self._started:
            raise ConfigurationError("call reset() before calling a tool")
        if self.error is not None:
            raise RuntimeError(f"this episode failed earlier ({self.error[:200]}); the tool was not run")
        if self.done:
            return _ENDED
        self._calls += 1
        call = {"id": f"call_{self._calls}", "type": "function", "function": {"name": name, "arguments": arguments}}
        return self._step({"role": "assistant", "content": None, "tool_calls": [call]})

    def _episode_reward(self) -> float | None:
        """The episode's total reward; ``None`` if it failed (TRL leaves the rollout unscored)."""
        if self.error is not None:
            warnings.warn(f"{self._env_id}: a rollout's episode failed, so it has no reward: {self.error[:300]}",
                          stacklevel=3)
            return None
        return float(self.reward)


def _release(slot: Slot) -> None:
    """Give an instance's slot back when the instance is collected (any thread; never waits)."""
    if not slot.pool.closed:
        runtime.close_later(slot.release())


class ToolReward(Environment):
    """An env whose agent acts through tools: it owns its reward (``get_reward``)."""

    def get_reward(self) -> float | None:
        """The episode's reward: the sum of what its steps earned (``None`` if it failed)."""
        return self._episode_reward()


class TextAnswer(Environment):
    """An env whose agent answers in plain text: :func:`env_reward` plays the final message."""

    def _answer(self, completion: Any) -> float | None:
        """Play the model's final message as the assistant's turn, if the episode awaits one; the
        episode's reward."""
        if not self._started:
            return None
        text = _final_text(completion)
        if text is not None and not self.done and self.error is None:
            with contextlib.suppress(OpenEnvGymError):  # recorded in self.error: no reward then
                self._step({"role": "assistant", "content": text})
        return self._episode_reward()


def _final_text(completion: Any) -> str | None:
    """The model's final message as text: a plain string, or the last assistant message that
    calls no tool (``None``: the completion ends otherwise, e.g. with a tool's result)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        last = completion[-1]
        if isinstance(last, dict) and last.get("role") == "assistant" and not last.get("tool_calls"):
            return _text([last]) if last.get("content") else ""
    return None


def env_reward(completions: list[Any], environments: list[Any] | None = None, **_: Any) -> list[float | None]:
    """TRL reward function: the env's reward for each rollout of an env that answers in plain text,
    its final message played through the env as the assistant's turn; ``None`` for other rollouts
    (their env scores them through ``get_reward``, so nothing is counted twice)."""
    if environments is None:
        raise ConfigurationError("env_reward scores rollouts of EnvSpec's environments: pass "
                                 "environment_factory=spec.environment_factory to the trainer")
    return [env._answer(completion) if isinstance(env, TextAnswer) else None
            for completion, env in zip(completions, environments, strict=True)]
