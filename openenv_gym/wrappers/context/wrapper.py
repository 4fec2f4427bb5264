"""ContextManagement: the Fleet context tools, answered locally, for any AgentEnv.

Long agent episodes outgrow a model's context window: tool outputs of hundreds of kilobytes
(database dumps, web pages, minified JSON) and dozens of turns. The Fleet integration written for
OpenEnv (its pull request #256, not merged) gives the agent five synthetic tools to cope with
that, which never reach the backend: ``check_context``, ``manage_context``, ``search_history``,
``search_tool_output`` and ``view_tool_output``. This module owns a Gymnasium wrapper that offers
them over *any* environment that follows the package's contract (docs/architecture.md, "The
Gymnasium contract"): the observation is the list of new chat messages, the action an assistant
message, ``info["tools"]`` the OpenAI tool specs. Nothing in it depends on a backend, so ORS,
Verifiers and Fleet envs get the same tools, and a trainer gets the same context semantics
whatever it trains on.

What the wrapper does, in short:

* every ``tool`` message of an observation whose text exceeds ``max_output_chars`` is cut to that
  many characters plus a note naming its ``output_id``; the full text is stored (every tool output
  is, so pruned outputs stay reachable) and can be searched and paged exactly;
* calls to the five tools are answered here, in the order the agent wrote them, and stripped from
  the message forwarded to the inner env (an action with only such calls never reaches it);
* the conversation is kept twice: :attr:`ContextManagement.full_history` (everything) and
  :attr:`ContextManagement.history` (the managed context, which ``manage_context`` prunes).

It never logs anything: tool outputs and prompts may hold secrets or private data.
"""

from __future__ import annotations

import bisect
import copy
import json
from collections.abc import Callable, Sequence
from typing import Any, SupportsFloat, cast

import gymnasium as gym
from gymnasium.utils import RecordConstructorArgs

from openenv_gym.actions import ParsedCall, check_call, tool_message
from openenv_gym.errors import ConfigurationError, EpisodeFinished, EpisodeNotStarted
from openenv_gym.spaces import AssistantAction
from openenv_gym.wire import Message, ToolSpec
from openenv_gym.wrappers.context.calls import Action, Answer, interleave, local_info, normalize, spec_of, type_error
from openenv_gym.wrappers.context.pages import (
    StoredOutput,
    calls_text,
    compile_pattern,
    count_lines,
    message_chars,
    page_header,
    snippet,
    text_of,
)
from openenv_gym.wrappers.context.tools import (
    CONTEXT_TOOLS,
    DEFAULT_MAX_OUTPUT_CHARS,
    DEFAULT_PAGE_SIZE,
    LOCAL,
    MAX_HISTORY_HITS,
    MAX_OUTPUT_HITS,
)

__all__ = ["ContextManagement"]


class ContextManagement(gym.Wrapper, RecordConstructorArgs):
    """Offer the Fleet context tools over any AgentEnv, answered locally and never forwarded.

    The five tools (:data:`CONTEXT_TOOLS`, OpenAI format, ``additionalProperties: false``) are
    appended to ``info["tools"]`` at reset and whenever the inner env reports a new tool list, and
    to :attr:`action_space` (an :class:`~openenv_gym.spaces.AssistantAction`), so ``sample()``
    may call them and ``contains`` accepts them. A tool of the inner env with one of these names
    is refused with :class:`~openenv_gym.errors.ConfigurationError` (it would be unreachable).

    Steps:

    * **Only context-tool calls**: answered here with ``tool`` messages (matching ``tool_call_id``
      and ``name``); reward ``0.0``, not terminated, not truncated; the inner env is not called,
      so the step does not count toward its ``max_turns``. ``info`` holds ``local_calls`` (one
      ``{"name", "ok"}`` per call) and no ``tools`` key, as the tool list did not change.
    * **Mixed** (context and env tools in one message): the inner env gets the message with only
      its own calls (and the text); the observation interleaves the local answers with the inner
      env's ``tool`` messages in the order of the original calls (matched by ``tool_call_id``;
      other inner messages keep their place). Reward, terminated, truncated and info come from the
      inner env, plus ``local_calls``. Calls without an ``id`` get ``call_<n>`` (``n`` = position in
      the original message) before forwarding, the id :func:`~openenv_gym.actions.parse_action`
      would have given them, so answers and results always pair up.
    * Context tools see the conversation as it was **before** the current message (a search does
      not find the call asking for it, nor the results of env calls in the same message).
      ``search_history`` skips context-tool calls and their answers altogether: they quote the
      conversation, so each search would otherwise find every earlier search.
    * Bad arguments (bad JSON, missing, unexpected, wrong type, out of range) are answered with an
      error ``tool`` message; the episode goes on.
    * ``max_local_calls`` (default ``None``: no limit) caps context-tool calls per episode so an
      agent cannot loop on them for free: an action that would exceed it is not run at all (none
      of its calls, local or not), every call gets a "not run" answer, and the step is
      **truncated** with ``info["error"] = {"type": "LocalCallLimit", "message": ...}``.

    Long outputs: each ``tool`` message of an inner observation whose text (the string content,
    or its text parts joined by newlines) is longer than ``max_output_chars`` shows only the first
    ``max_output_chars`` characters, then a newline and a note with its ``output_id``, full size
    and how to call ``view_tool_output``/``search_tool_output`` (image parts are kept after the
    text part). Every tool output of the inner env is stored in full (ids 1, 2, ... per episode),
    truncated or not, so outputs dropped by ``manage_context`` stay readable. ``None`` disables
    truncation.

    Page format of ``view_tool_output``: one header line ending in ``\\n``, e.g.
    ``[output_id=3 page 2 of 7: lines 51-100 of 342]`` (plus a remark when a page starts or ends
    inside a line), followed by the page's text exactly as it is in the output, its last line
    keeping its own line ending if it has one. Lines end at ``\\n`` only (``\\r\\n`` stays in its
    line). A page holds at most ``page_size`` lines *and* at most ``max_output_chars`` characters:
    a line longer than that is split across pages. So the bodies of pages 1..n (each answer minus
    its first line) concatenate to the stored output exactly.

    Conversation state, for a trainer that owns the prompt:

    * :attr:`full_history` — the opening observation, every action as an assistant message
      (tool-call ids filled in, dict arguments encoded as JSON), and every observation message as
      the agent received it; never pruned.
    * :attr:`history` — the managed context: the same, minus what ``manage_context`` dropped.
    * After a step in which ``manage_context`` dropped messages, ``info["context"] = {"pruned": True, "messages":
      <history>, "dropped": <count>}``: the messages a trainer should replace its context with
      (they end with this step's assistant message and observation).

    :meth:`reset` clears all of it. The task API stays on ``env.unwrapped`` as usual.

    Args:
        env: an env following the openenv_gym contract (``AgentEnv`` or a wrapper of one). Its
            action space, if an :class:`~openenv_gym.spaces.AssistantAction`, is extended with
            the five tools.
        max_output_chars: truncation limit of tool outputs and character budget of a page
            (default 10,000; ``None``: no truncation).
        max_local_calls: context-tool calls allowed per episode (``None``: unlimited).

    Raises:
        ConfigurationError: a bad ``max_output_chars`` or ``max_local_calls``, or an inner tool
            named like one of the context tools.

    Example:
        >>> import gymnasium as gym, openenv_gym
        >>> from openenv_gym.wrappers import ContextManagement
        >>> env = ContextManagement(gym.make("openenv/Arithmetic-v0"), max_output_chars=2_000)
        >>> obs, info = env.reset(seed=0)
        >>> [t["function"]["name"] for t in info["tools"]][2:]   # after the env's calculator and submit
        ['check_context', 'manage_context', 'search_history', 'search_tool_output', 'view_tool_output']
        >>> call = {"id": "c1", "type": "function", "function": {"name": "check_context", "arguments": "{}"}}
        >>> obs, reward, terminated, truncated, info = env.step({"role": "assistant", "tool_calls": [call]})
        >>> obs[0]["name"], reward, terminated, truncated, info
        ('check_context', 0.0, False, False, {'local_calls': [{'name': 'check_context', 'ok': True}]})
        >>> len(env.full_history)   # the opening message, the action, the local answer
        3
        >>> env.close()
    """

    def __init__(
        self,
        env: gym.Env,
        max_output_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS,
        max_local_calls: int | None = None,
    ):
        if max_output_chars is not None and (isinstance(max_output_chars, bool) or max_output_chars < 1):
            raise ConfigurationError("max_output_chars must be a positive integer or None")
        if max_local_calls is not None and (isinstance(max_local_calls, bool) or max_local_calls < 0):
            raise ConfigurationError("max_local_calls must be a non-negative integer or None")
        RecordConstructorArgs.__init__(self, max_output_chars=max_output_chars, max_local_calls=max_local_calls)
        gym.Wrapper.__init__(self, env)
        self.max_output_chars = max_output_chars
        self.max_local_calls = max_local_calls
        inner_space = env.action_space
        inner_tools = list(inner_space.tools) if isinstance(inner_space, AssistantAction) else []
        self._check_names(inner_tools)
        self.action_space = AssistantAction(
            inner_tools + list(CONTEXT_TOOLS),
            text_probability=getattr(inner_space, "text_probability", 0.1),
        )
        self._handlers: dict[str, Callable[[dict[str, Any]], tuple[str, bool]]] = {
            "check_context": self._check_context,
            "manage_context": self._manage_context,
            "search_history": self._search_history,
            "search_tool_output": self._search_tool_output,
            "view_tool_output": self._view_tool_output,
        }
        self._clear()
        self._started = False

    # -- state ------------------------------------------------------------------------------------
    def _clear(self) -> None:
        self._history: list[Message] = []
        self._full: list[Message] = []
        self._outputs: list[StoredOutput] = []
        self._local_answers: set[int] = set()  # full_history positions of our own answers
        self._local_calls = 0
        self._done = False
        self._pruned: int | None = None  # messages dropped by manage_context during this step

    @property
    def history(self) -> list[Message]:
        """The managed conversation (what the agent's context should hold), oldest first."""
        return list(self._history)

    @property
    def full_history(self) -> list[Message]:
        """The whole conversation of the episode, including what ``manage_context`` dropped."""
        return list(self._full)

    # -- tools ------------------------------------------------------------------------------------
    @staticmethod
    def _check_names(tools: Sequence[ToolSpec]) -> None:
        clash = sorted(t.name for t in tools if t.name in LOCAL)
        if clash:
            raise ConfigurationError(
                f"the environment has its own tool(s) {clash}, which ContextManagement would hide; "
                "rename them or do not wrap this env"
            )

    def _merge_tools(self, info: dict[str, Any]) -> None:
        """Add the context tools to ``info["tools"]`` and to the action space (in place)."""
        inner = [spec_of(t) for t in info["tools"]]
        self._check_names(inner)
        cast(AssistantAction, self.action_space).tools = inner + list(CONTEXT_TOOLS)  # set so in __init__
        # Fresh dicts each time: callers keep infos, and a shared schema edited in one would leak.
        info["tools"] = list(info["tools"]) + [copy.deepcopy(t.to_openai()) for t in CONTEXT_TOOLS]

    # -- Gymnasium API ------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Reset the inner env and start a fresh conversation.

        Args:
            seed: passed to the inner env's ``reset``.
            options: passed to the inner env's ``reset`` (``split``, ``index``, ``task``).

        Returns:
            ``(observation, info)`` of the inner env, with long tool outputs truncated and the
            context tools appended to ``info["tools"]``. :attr:`history`,
            :attr:`full_history`, the stored outputs and the context-tool call count start
            afresh.
        """
        obs, info = self.env.reset(seed=seed, options=options)
        self._clear()
        self._started = True
        info = dict(info)
        if "tools" in info:
            self._merge_tools(info)
        obs = self._take_observation(obs)
        self._commit(None, obs)
        return obs, info

    def step(self, action: Any) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Answer context-tool calls locally and forward the rest to the inner env.

        Args:
            action: assistant text or an OpenAI assistant message, as for the inner env; it may
                call the context tools, the inner env's tools, or both.

        Returns:
            ``(observation, reward, terminated, truncated, info)``. With only context-tool
            calls: their answers, reward ``0.0``, neither terminated nor truncated, and
            ``info["local_calls"]``; the inner env is not stepped. Otherwise the inner env's
            result, with the local answers interleaved in call order and
            ``info["local_calls"]`` added. Over ``max_local_calls``: nothing runs, and the
            step is truncated with ``info["error"]``. Details in the class docstring.

        Raises:
            EpisodeNotStarted: before :meth:`reset`.
            EpisodeFinished: after the episode ended.
        """
        if not self._started:
            raise EpisodeNotStarted("call reset() before step()")
        if self._done:
            raise EpisodeFinished("the episode has ended; call reset() to start a new one")
        act = normalize(action)
        calls = act.calls
        local = [i for i, c in enumerate(calls) if c.name in LOCAL]
        if not local:
            # Nothing for us: the inner env gets the action exactly as the agent wrote it.
            return self._forward(action, act, [])
        if self.max_local_calls is not None and self._local_calls + len(local) > self.max_local_calls:
            return self._refuse(act)
        self._local_calls += len(local)
        if len(local) == len(calls):
            answers = self._answer(calls, local)
            obs = [a.message for a in answers]
            info: dict[str, Any] = {"local_calls": local_info(calls, answers)}
            self._commit(act.message, obs, local_positions=range(len(obs)))
            self._add_context(info)
            return obs, 0.0, False, False, info
        assert act.original is not None
        is_local = set(local)
        forwarded = {
            **act.original,
            "role": "assistant",
            "tool_calls": [raw for i, raw in enumerate(act.raw_calls) if i not in is_local],
        }
        return self._forward(forwarded, act, local)

    # -- step internals ---------------------------------------------------------------------------
    def _forward(
        self, forwarded: Any, act: Action, local: list[int]
    ) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the inner env with ``forwarded``, then answer the ``local`` calls and merge."""
        # The inner env runs first: if it raises (a dead server), no context tool has pruned yet.
        inner_obs, reward, terminated, truncated, info = self.env.step(forwarded)
        info = dict(info)
        if "tools" in info:
            self._merge_tools(info)
        answers = self._answer(act.calls, local)
        inner_obs = self._take_observation(inner_obs)
        obs, positions = interleave(act.calls, answers, inner_obs)
        if answers:
            info["local_calls"] = local_info(act.calls, answers)
        self._commit(act.message, obs, local_positions=positions)
        self._add_context(info)
        self._done = bool(terminated or truncated)
        return obs, reward, terminated, truncated, info

    def _refuse(self, act: Action) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Stop an episode whose agent asked for more context-tool calls than allowed."""
        text = (
            f"Not run: this episode allows at most {self.max_local_calls} context-tool calls "
            f"({self._local_calls} used); the episode is stopped."
        )
        obs = [tool_message(c.id, c.name, text) for c in act.calls]
        self._commit(act.message, obs, local_positions=range(len(obs)))
        self._done = True
        info = {
            "local_calls": [{"name": c.name, "ok": False} for c in act.calls if c.name in LOCAL],
            "error": {"type": "LocalCallLimit", "message": text},
        }
        return obs, 0.0, False, True, info

    def _answer(self, calls: list[ParsedCall], local: list[int]) -> list[Answer]:
        answers = []
        self._pruned = None
        for i in local:
            call = calls[i]
            args = dict(call.arguments or {})
            # check_call: bad JSON, missing and unexpected arguments; then types, which it leaves
            # to backends but which nobody else will check for these tools.
            problem = check_call(call, LOCAL) or type_error(call.name, args, LOCAL[call.name].parameters or {})
            if problem is not None:
                text, ok = problem, False
            else:
                text, ok = self._handlers[call.name](args)
            answers.append(Answer(i, tool_message(call.id, call.name, text), ok))
        return answers

    def _take_observation(self, obs: list[Message]) -> list[Message]:
        """Copy the inner observation, storing every tool output and truncating the long ones."""
        out = []
        for m in obs:
            m = dict(m)
            if m.get("role") == "tool":
                text = text_of(m.get("content"))
                limit = self.max_output_chars
                stored = StoredOutput(
                    id=len(self._outputs) + 1,
                    text=text,
                    truncated=limit is not None and len(text) > limit,
                    lines=count_lines(text),
                )
                self._outputs.append(stored)
                if stored.truncated:
                    m["content"] = self._truncated_content(m.get("content"), stored)
            out.append(m)
        return out

    def _truncated_content(self, content: Any, stored: StoredOutput) -> Any:
        limit = self.max_output_chars
        assert limit is not None
        oid = stored.id
        note = (
            f"[Output truncated: showing the first {limit:,} of {len(stored.text):,} characters "
            f"({stored.lines:,} lines). The full output is stored as output_id={oid}: read it with "
            f"view_tool_output(output_id={oid}, page=1) (pages of up to {DEFAULT_PAGE_SIZE} lines), "
            f"or find lines with search_tool_output(pattern, output_id={oid}).]"
        )
        text = stored.text[:limit] + "\n" + note
        if isinstance(content, str) or content is None:
            return text
        others = [p for p in content if not (isinstance(p, dict) and p.get("type") == "text")]
        return [{"type": "text", "text": text}, *others]

    def _commit(self, action: Message | None, obs: list[Message], local_positions: Any = ()) -> None:
        """Append the action and the observation to both histories (the same dicts in each)."""
        if action is not None:
            self._full.append(action)
            self._history.append(action)
        start = len(self._full)
        self._local_answers.update(start + p for p in local_positions)
        for m in obs:
            self._full.append(m)
            self._history.append(m)

    def _add_context(self, info: dict[str, Any]) -> None:
        if self._pruned is not None:
            info["context"] = {"pruned": True, "messages": list(self._history), "dropped": self._pruned}
            self._pruned = None

    # -- the five tools -----------------------------------------------------------------------------
    def _check_context(self, args: dict[str, Any]) -> tuple[str, bool]:
        chars = sum(message_chars(m) for m in self._history)
        report = {
            "messages": len(self._history),
            "turns": sum(1 for m in self._history if m.get("role") == "assistant"),
            "characters": chars,
            "estimated_tokens": -(-chars // 4),
            "pruned_messages": len(self._full) - len(self._history),
            "stored_tool_outputs": len(self._outputs),
            "truncated_tool_outputs": sum(1 for o in self._outputs if o.truncated),
            "max_output_chars": self.max_output_chars,
        }
        if self.max_local_calls is not None:
            report["context_tool_calls_left"] = self.max_local_calls - self._local_calls
        return json.dumps(report), True

    def _manage_context(self, args: dict[str, Any]) -> tuple[str, bool]:
        keep = args["keep_recent_turns"]
        history = self._history
        starts = [i for i, m in enumerate(history) if m.get("role") == "assistant"]
        opening = starts[0] if starts else len(history)
        if keep >= len(starts):
            return (
                f"Nothing to drop: the context holds {len(starts)} turn(s) after the opening "
                f"({len(history)} messages).",
                True,
            )
        cut = starts[len(starts) - keep] if keep else len(history)
        dropped = history[opening:cut]
        self._history = history[:opening] + history[cut:]
        self._pruned = (self._pruned or 0) + len(dropped)
        chars = sum(message_chars(m) for m in dropped)
        return (
            f"Dropped the {len(starts) - keep} oldest turn(s): {len(dropped)} messages, {chars:,} "
            f"characters. Kept the opening ({opening} messages) and the last {keep} turn(s) "
            f"({len(self._history) - opening} messages). Dropped messages stay searchable with "
            "search_history; tool outputs stay readable with view_tool_output and "
            "search_tool_output.",
            True,
        )

    def _search_history(self, args: dict[str, Any]) -> tuple[str, bool]:
        regex, note = compile_pattern(args["pattern"])
        in_context = {id(m) for m in self._history}
        hits: list[str] = []
        total = 0
        for pos, m in enumerate(self._full):
            if pos in self._local_answers:
                continue  # our own answers quote history: searching them would echo past searches
            text = text_of(m.get("content"))
            # Context-tool calls are skipped too: every search's own pattern would match itself.
            calls = calls_text(m, skip=LOCAL)
            text = f"{text}\n{calls}" if text and calls else text or calls
            match = regex.search(text)
            if match is None:
                continue
            total += 1
            if len(hits) < MAX_HISTORY_HITS:
                label = m.get("role", "?")
                if m.get("role") == "tool" and m.get("name"):
                    label += f" {m['name']}"
                if id(m) not in in_context:
                    label += ", pruned"
                hits.append(f"message {pos} [{label}]: {snippet(text, match)}")
        if not total:
            return f"{note}No message matches {args['pattern']!r}.", True
        shown = f" (showing the first {len(hits)})" if total > len(hits) else ""
        head = f"{note}{total} message(s) match {args['pattern']!r}{shown}; positions count from 0:"
        return "\n".join([head, *hits]), True

    def _search_tool_output(self, args: dict[str, Any]) -> tuple[str, bool]:
        output_id = args.get("output_id")
        if output_id is not None:
            stored = self._output(output_id)
            if isinstance(stored, str):
                return stored, False
            targets = [stored]
        else:
            targets = self._outputs
        if not targets:
            return "No tool output is stored yet.", True
        regex, note = compile_pattern(args["pattern"])
        hits: list[str] = []
        total = 0
        for out in targets:
            page_starts = [p.start for p in out.pages(DEFAULT_PAGE_SIZE, self.max_output_chars)]
            text, pos, line = out.text, 0, 0
            while pos < len(text):
                nl = text.find("\n", pos)
                end = len(text) if nl < 0 else nl
                line += 1
                content = text[pos : end - 1] if end > pos and text[end - 1] == "\r" else text[pos:end]
                match = regex.search(content)
                if match is not None:
                    total += 1
                    if len(hits) < MAX_OUTPUT_HITS:
                        page = bisect.bisect_right(page_starts, pos)
                        hits.append(f"output_id={out.id} line {line} (page {page}): {snippet(content, match)}")
                pos = end + 1
        if not total:
            where = f"output_id={output_id}" if output_id is not None else f"{len(targets)} stored output(s)"
            return f"{note}No line of {where} matches {args['pattern']!r}.", True
        shown = f" (showing the first {len(hits)})" if total > len(hits) else ""
        head = (
            f"{note}{total} line(s) match {args['pattern']!r}{shown}. Pages are for "
            f"view_tool_output with page_size={DEFAULT_PAGE_SIZE}:"
        )
        return "\n".join([head, *hits]), True

    def _view_tool_output(self, args: dict[str, Any]) -> tuple[str, bool]:
        stored = self._output(args["output_id"])
        if isinstance(stored, str):
            return stored, False
        page_no = args.get("page", 1)
        page_size = args.get("page_size", DEFAULT_PAGE_SIZE)
        pages = stored.pages(page_size, self.max_output_chars)
        if page_no > len(pages):
            return (
                f"Error: page {page_no} does not exist: output_id={stored.id} has {len(pages)} page(s) "
                f"with page_size={page_size}.",
                False,
            )
        page = pages[page_no - 1]
        return page_header(stored, page_no, len(pages), page) + stored.text[page.start : page.end], True

    def _output(self, output_id: int) -> StoredOutput | str:
        if 1 <= output_id <= len(self._outputs):
            return self._outputs[output_id - 1]
        have = f"1-{len(self._outputs)}" if self._outputs else "none yet"
        return f"Error: there is no tool output with output_id={output_id} (stored: {have})."
