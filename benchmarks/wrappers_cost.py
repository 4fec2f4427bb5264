"""What each training wrapper adds to a step, in microseconds.

Each wrapper is timed against the same env without it, on the same actions, in the same round:
the added cost per step is ``(wrapped time - bare time) / steps``, each side playing whole
episodes (reset included). Two envs:

* an in-process env that follows the package's contract (the real action parser, tool answers,
  8-turn episodes, no I/O), so the figure is the wrapper's own cost without network noise;
  ``ChatTokens`` and the full stack use a byte-level BPE tokenizer trained in memory and a
  Qwen 2.5-style chat template (no download), and their cost grows with the conversation (the
  template renders it whole each turn): 8 turns here;
* the bundled Arithmetic env (a local ORS server), bare against the full stack
  (``ConversationHistory(RecordEpisodes(ChatTokens(TextToolCalls(env))))``), for scale next to a
  real step.

Sides alternate over ``--reps`` rounds; each figure is the median of the per-round figures with
its min-max. No targets: the issue asks for the costs to be printed.

    python benchmarks/wrappers_cost.py [--reps 5] [--episodes 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gymnasium as gym  # noqa: E402
from figures import figure, write  # noqa: E402

import openenv_gym  # noqa: E402,F401
from openenv_gym.actions import parse_action, tool_message, user_message  # noqa: E402
from openenv_gym.spaces import AssistantAction, Messages  # noqa: E402
from openenv_gym.wire import ToolSpec  # noqa: E402
from openenv_gym.wrappers import ChatTokens, ConversationHistory, RecordEpisodes, TextToolCalls  # noqa: E402

TURNS = 8
CALC = ToolSpec("calculator", "Evaluate an expression.",
                {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]})


class InProcessEnv(gym.Env):
    """The contract without I/O: opening messages and tools, the real parser, one answer per call."""

    metadata = {"render_modes": []}

    def __init__(self, turns: int = TURNS):
        self.turns = turns
        self.observation_space = Messages()
        self.action_space = AssistantAction([CALC])
        self._turn = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._turn = 0
        return ([{"role": "system", "content": "You solve arithmetic."},
                 {"role": "user", "content": "Compute (15 + 80) * 8 with the calculator, then answer."}],
                {"tools": [CALC.to_openai()], "task_id": "train/0", "split": "train", "index": 0})

    def step(self, action):
        turn = parse_action(action)
        self._turn += 1
        answer = [tool_message(c.id, c.name, "760") for c in turn.calls] or [user_message("No tool call found.")]
        done = self._turn >= self.turns
        return answer, float(done), done, False, {"turn": self._turn}


def template() -> str:
    """A Qwen 2.5-style chat template: tools in the system prompt, Hermes tool calls."""
    return (
        "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}"
        "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
        "{%- for message in messages %}"
        "{%- if message.role in ['user', 'system'] %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
        "{%- if message.content %}{{- message.content }}{%- endif %}"
        "{%- for tc in message.tool_calls or [] %}{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
        "{{- '<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' }}"
        "{{- tc.function.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
        "{%- elif message.role == 'tool' %}"
        "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


def tokenizer() -> Any:
    """A byte-level BPE trained in memory (lossless on any text) with the template above."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["Compute (15 + 80) * 8 with the calculator, then answer. You solve arithmetic.",
              '<tool_call> {"name": "calculator", "arguments": {"expression": "15 + 80"}} </tool_call> '
              "<tool_response> Let me compute. No tool call found. system user assistant tools"] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        vocab_size=800, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 clean_up_tokenization_spaces=False)
    hf.chat_template = template()
    return hf


def call_text(expression: str) -> str:
    return ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": '
            + json.dumps({"expression": expression}) + "}\n</tool_call>")


def call_message(expression: str, turn: int, name: str = "calculator", key: str = "expression") -> dict:
    return {"role": "assistant", "content": "Let me compute.", "tool_calls": [
        {"id": f"call_{turn}_0", "type": "function",
         "function": {"name": name, "arguments": json.dumps({key: expression})}}]}


def play(env: gym.Env, actions: list[Any], episodes: int, options: dict | None = None) -> tuple[float, int]:
    """Seconds and steps for ``episodes`` episodes of ``actions`` (until the episode ends)."""
    steps = 0
    start = time.perf_counter()
    for _ in range(episodes):
        env.reset(options=options)
        for action in actions:
            steps += 1
            *_, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
    return time.perf_counter() - start, steps


Case = tuple[str, Callable[[], gym.Env], list[Any], Callable[[], gym.Env], list[Any]]


def added_us(case: Case, episodes: int, flip: bool, options: dict | None = None) -> float:
    """One round of one case: the wrapper's added microseconds per step."""
    _, make_bare, bare_actions, make_wrapped, wrapped_actions = case
    sides = [(make_bare, bare_actions), (make_wrapped, wrapped_actions)]
    if flip:
        sides.reverse()
    got = []
    for make, actions in sides:
        env = make()
        try:
            play(env, actions, max(1, episodes // 10), options)  # warm-up
            got.append(play(env, actions, episodes, options))
        finally:
            env.close()
    if flip:
        got.reverse()
    (bare_s, bare_n), (wrapped_s, wrapped_n) = got
    assert bare_n == wrapped_n, "both sides must play the same steps"
    return (wrapped_s - bare_s) / wrapped_n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=200, help="episodes per side per round (in-process env)")
    parser.add_argument("--server-episodes", type=int, default=60, help="episodes per side per round (Arithmetic)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    tok = tokenizer()
    tmp = tempfile.mkdtemp(prefix="wrappers-cost-")
    log = os.path.join(tmp, "episodes.jsonl")
    texts = [call_text(f"{n} + 1") for n in range(TURNS)]
    messages = [call_message(f"{n} + 1", n + 1) for n in range(TURNS)]
    ids = [tok.encode(t + "<|im_end|>", add_special_tokens=False) for t in texts]

    def recorded(env: gym.Env) -> gym.Env:
        return RecordEpisodes(env, log, max_bytes=50_000_000, backups=1)

    cases: list[Case] = [
        ("ConversationHistory", InProcessEnv, messages, lambda: ConversationHistory(InProcessEnv()), messages),
        ("TextToolCalls (Hermes text)", InProcessEnv, messages, lambda: TextToolCalls(InProcessEnv()), texts),
        ("RecordEpisodes", InProcessEnv, messages, lambda: recorded(InProcessEnv()), messages),
        ("ChatTokens (token-id actions, 8-turn episodes)", lambda: TextToolCalls(InProcessEnv()), texts,
         lambda: ChatTokens(TextToolCalls(InProcessEnv()), tok), ids),
        ("all four stacked", InProcessEnv, messages,
         lambda: ConversationHistory(recorded(ChatTokens(TextToolCalls(InProcessEnv()), tok))), ids),
    ]

    # The real env: bare against the full stack, on one fixed task so the actions are fixed too.
    arith = gym.make("openenv/Arithmetic-v0")
    obs, _ = arith.reset(options={"index": 7})
    question = obs[0]["content"].split("Compute ", 1)[1].split(". ", 1)[0]
    answer = str(eval(question))  # noqa: S307 - the task's own arithmetic
    server_texts = [call_text(question), "Checking.",
                    '<tool_call>\n{"name": "submit", "arguments": ' + json.dumps({"answer": answer}) + "}\n</tool_call>"]
    server_messages = [call_message(question, 1), {"role": "assistant", "content": "Checking."},
                       call_message(answer, 3, "submit", "answer")]
    server_ids = [tok.encode(t + "<|im_end|>", add_special_tokens=False) for t in server_texts]

    class Shared(gym.Wrapper):
        """The one server env, not closed between sides (a server start is not what is measured)."""

        def close(self) -> None:
            pass

    server_case: Case = (
        "all four stacked, on the Arithmetic server", lambda: Shared(arith), server_messages,
        lambda: ConversationHistory(recorded(ChatTokens(TextToolCalls(Shared(arith)), tok))), server_ids)

    rows: list[dict[str, float]] = []
    try:
        bare_step_us = []
        for r in range(args.reps):
            row = {name: added_us((name, *rest), args.episodes, flip=bool(r % 2))
                   for name, *rest in cases}
            row[server_case[0]] = added_us(server_case, args.server_episodes, bool(r % 2), {"index": 7})
            seconds, steps = play(Shared(arith), server_messages, args.server_episodes, {"index": 7})
            bare_step_us.append(seconds / steps * 1e6)
            rows.append(row)
            print(f"round {r}: " + "  ".join(f"{k} {v:+.1f}" for k, v in row.items()) + " us/step", flush=True)
    finally:
        arith.close()
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)

    figures = [figure(f"{name}: added per step", [row[name] for row in rows], unit="us", higher_is_better=False)
               for name in rows[0]]
    figures.append(figure("Arithmetic server: bare env step (for scale)", bare_step_us, unit="us",
                          higher_is_better=False))
    for f in figures:
        print(f"{f['name']}: {f['median']:.1f} us ({f['min']:.1f} to {f['max']:.1f})")
    write(args.json, figures, {"rounds": rows, "turns_in_process": TURNS, "episodes": args.episodes,
                               "server_episodes": args.server_episodes})


if __name__ == "__main__":
    main()
