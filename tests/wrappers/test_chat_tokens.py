"""ChatTokens over the real Arithmetic env, with a tokenizer built offline.

The tokenizer is a byte-level BPE trained in memory on a few sentences (every text encodes and
decodes losslessly, as with GPT-2 or Qwen tokenizers) wrapped in ``PreTrainedTokenizerFast``, and
the chat template is a Qwen 2.5-style string (tools in the system prompt, Hermes ``<tool_call>``
blocks, tool answers as ``<tool_response>``): no download, no network. The "model" is a script
that writes its completions as that template renders assistant turns and hands them over as token
ids; the env behind ``TextToolCalls`` runs the calls.

What a trainer relies on: over multi-turn tool episodes every prompt starts with the previous
prompt plus the completion (no ``token_prefix_mismatch``) and equals the template's own rendering
of the conversation; token-id actions are decoded for the env (the episodes are solved); a template
that renders past turns differently from the generation prompt is reported at the right position;
RecordEpisodes above stores each turn's tokens.
"""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import openenv_gym  # noqa: F401  (registers openenv/Arithmetic-v0)
from openenv_gym.errors import ConfigurationError, InvalidAction
from openenv_gym.records import read_records
from openenv_gym.wrappers import ChatTokens, ConversationHistory, RecordEpisodes, TextToolCalls

pytest.importorskip("transformers", reason="ChatTokens needs the `tokens` extra (transformers)")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _assistant_turn(past: bool) -> str:
    think = "<think>\n\n</think>\n\n" if past else ""  # the deliberately broken variant's difference
    return (
        "{{- '<|im_start|>assistant\\n' + '" + think.replace("\n", "\\n") + "' }}"
        "{%- if message.content %}{{- message.content }}{%- endif %}"
        "{%- for tc in message.tool_calls or [] %}"
        "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
        "{{- '<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' }}"
        "{{- tc.function.arguments | tojson }}{{- '}\\n</tool_call>' }}"
        "{%- endfor %}{{- '<|im_end|>\\n' }}"
    )


def make_template(broken: bool = False) -> str:
    return (
        "{%- if tools %}{{- '<|im_start|>system\\n' }}"
        "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
        "{{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
        "{{- '\\n</tools>\\nCall a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\\n' }}"
        "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- for message in messages %}"
        "{%- if message.role == 'user' %}{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- elif message.role == 'assistant' %}" + _assistant_turn(broken) +
        "{%- elif message.role == 'tool' %}"
        "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


TEMPLATE = make_template()
BROKEN = make_template(broken=True)


@pytest.fixture(scope="module")
def tokenizer():
    corpus = ["Compute (15 + 80) * 8. You may use the `calculator` tool for intermediate steps.",
              'When done, call `submit` with the final integer answer. {"name": "calculator", "arguments": '
              '{"expression": "1 + 2"}} <tool_call> </tool_call> <tool_response> Correct! Incorrect.',
              "user assistant system tools I will compute the answer now. Checking the result."] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 clean_up_tokenization_spaces=False)
    hf.chat_template = TEMPLATE
    return hf


@pytest.fixture(scope="module")
def base():
    env = gym.make("openenv/Arithmetic-v0", max_turns=8)
    yield env
    env.close()


def template_form(messages: list[dict]) -> list[dict]:
    """Messages as HF templates take them (tool-call arguments as objects), computed independently."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                                     for c in m["tool_calls"]]}
        out.append(m)
    return out


def rendered_ids(tokenizer, messages, tools, template=TEMPLATE) -> list[int]:
    text = tokenizer.apply_chat_template(template_form(messages), tools=tools, chat_template=template,
                                         tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def completion(tokenizer, content: str | None = None, calls: list[tuple[str, dict]] = ()) -> list[int]:
    """What the model writes for a turn, exactly as the template renders assistant turns, as ids."""
    parts = [content] if content else []
    parts += ['<tool_call>\n{"name": "' + n + '", "arguments": ' + json.dumps(a, ensure_ascii=False) + "}\n</tool_call>"
              for n, a in calls]
    return tokenizer.encode("\n".join(parts) + "<|im_end|>", add_special_tokens=False)


def question(obs) -> str:
    return obs[0]["content"].split("Compute ", 1)[1].split(". ", 1)[0]


def stack(base, tokenizer, **kwargs):
    return ConversationHistory(ChatTokens(TextToolCalls(base, formats=["hermes"]), tokenizer, **kwargs))


WORDS = ["I", "will", "compute", "the", "answer", "now.", "Checking", "result", "first,", "then", "submit"]


@settings(max_examples=12, deadline=None)
@given(index=st.integers(0, 1999), chatter=st.lists(st.lists(st.sampled_from(WORDS), max_size=6).map(" ".join),
                                                    min_size=3, max_size=3),
       text_turn=st.booleans(), as_array=st.booleans())
def test_prefix_holds_over_multi_turn_tool_episodes(base, tokenizer, index, chatter, text_turn, as_array):
    env = stack(base, tokenizer)
    obs, info = env.reset(options={"index": index})
    tools = info["tools"]
    prompt = info["prompt_token_ids"]
    assert prompt == rendered_ids(tokenizer, obs, tools)
    q = question(obs)
    turns = [completion(tokenizer, chatter[0], [("calculator", {"expression": q})])]
    if text_turn:
        turns.append(completion(tokenizer, chatter[1] or "Checking."))  # no call: the env asks for one
    for _, ids in enumerate(turns):
        obs, reward, terminated, truncated, info = env.step(np.array(ids) if as_array else ids)
        assert "token_prefix_mismatch" not in info, info["token_prefix_mismatch"]
        assert info["prompt_token_ids"][:len(prompt) + len(ids)] == prompt + ids
        assert info["prompt_token_ids"] == rendered_ids(tokenizer, obs, tools)
        assert info["turn_tokens"] == {"prompt_token_ids": prompt, "completion_token_ids": ids, "logprobs": None}
        prompt = info["prompt_token_ids"]
    value = [m for m in obs if m["role"] == "tool"][-1]["content"]
    ids = completion(tokenizer, chatter[2], [("calculator", {"expression": value}), ("submit", {"answer": value})])
    obs, reward, terminated, truncated, info = env.step(ids)
    assert "token_prefix_mismatch" not in info
    assert (reward, terminated) == (1.0, True)  # the decoded calls reached the env and solved the task
    assert info["prompt_token_ids"] == rendered_ids(tokenizer, obs, tools)


def test_text_actions_are_checked_against_the_previous_prompt(base, tokenizer):
    env = stack(base, tokenizer)
    _, info = env.reset(seed=4)
    prompt = info["prompt_token_ids"]
    obs, *_, info = env.step('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>')
    assert "token_prefix_mismatch" not in info and info["prompt_token_ids"][:len(prompt)] == prompt
    assert info["turn_tokens"]["completion_token_ids"] is None and obs[-1]["content"] == "4"


def test_a_broken_template_is_reported_at_the_first_differing_token(base, tokenizer):
    env = stack(base, tokenizer, chat_template=BROKEN)
    obs, info = env.reset(seed=5)
    prompt, tools = info["prompt_token_ids"], info["tools"]
    ids = completion(tokenizer, "I will compute.", [("calculator", {"expression": question(obs)})])
    obs, *_, info = env.step(ids)
    mismatch = info["token_prefix_mismatch"]
    new = info["prompt_token_ids"]
    expected = prompt + ids
    k = next(i for i, (a, b) in enumerate(zip(expected, new)) if a != b)
    assert mismatch["position"] == k == len(prompt)  # the first completion token: "<think>" came instead
    assert (mismatch["expected"], mismatch["got"]) == (ids[0], new[k])
    assert mismatch["got_text"].startswith("<think>") and mismatch["expected_text"].startswith("I will")
    # Never re-tokenised to hide it: the prompt is the broken template's own rendering.
    assert new == rendered_ids(tokenizer, obs, tools, BROKEN)
    obs, *_, info = env.step(completion(tokenizer, "More."))
    assert info["token_prefix_mismatch"]["position"] == len(new)  # reported again at every turn it happens


def test_record_episodes_above_stores_each_turns_tokens(base, tokenizer, tmp_path):
    path = tmp_path / "tokens.jsonl"
    env = RecordEpisodes(ChatTokens(TextToolCalls(base), tokenizer), path)
    obs, info = env.reset(options={"index": 11})
    prompts = [info["prompt_token_ids"]]
    first = completion(tokenizer, None, [("calculator", {"expression": question(obs)})])
    obs, *_, info = env.step({"token_ids": first, "logprobs": [-0.5] * len(first)})
    prompts.append(info["prompt_token_ids"])
    obs, *_, info = env.step("Just text this time.")
    prompts.append(info["prompt_token_ids"])
    last = completion(tokenizer, None, [("submit", {"answer": obs[0]["content"] if obs[0]["role"] == "tool" else "0"})])
    env.step(last)
    [record] = read_records(path)  # readable at once, while the file is still open
    assert len(record.actions()) == 3
    assert record.prompt_token_ids == prompts
    assert record.completion_token_ids == [first, None, last]
    assert record.logprobs == [[-0.5] * len(first), None, None]
    assert record.actions()[0]["tool_calls"][0]["function"]["name"] == "calculator"


def test_bad_token_actions_raise_before_the_env_is_stepped(base, tokenizer):
    env = ChatTokens(base, tokenizer)
    env.reset(seed=6)
    for bad in ([len(tokenizer)], [-1], {"token_ids": [1, 2], "logprobs": [0.0]}, {"token_ids": ["a"]},
                {"token_ids": [1], "logprobs": ["x"]}):
        with pytest.raises(InvalidAction):
            env.step(bad)
    *_, info = env.step(tokenizer.encode("hello", add_special_tokens=False))
    assert info["turn"] == 1  # none of the bad actions reached the env


def test_template_errors_are_reported_and_the_step_kept(base, tokenizer):
    template = "{%- if messages | length > 2 %}{{ raise_exception('conversation too long') }}{%- endif %}" + TEMPLATE
    env = ChatTokens(base, tokenizer, chat_template=template)
    _, info = env.reset(seed=7)
    assert info["prompt_token_ids"]
    obs, reward, terminated, truncated, info = env.step("hi")
    assert "conversation too long" in info["chat_template_error"] and info["prompt_token_ids"] is None
    assert obs[0]["role"] == "user" and info["turn"] == 1
    *_, info = env.step("again")
    assert "token_prefix_mismatch" not in info and info["turn_tokens"]["prompt_token_ids"] is None


def test_a_tokenizer_without_template_or_api_is_refused(base, tokenizer):
    bare = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    with pytest.raises(ConfigurationError, match="chat template"):
        ChatTokens(base, bare)
    ChatTokens(base, bare, chat_template=TEMPLATE)  # a template given explicitly is enough
    with pytest.raises(ConfigurationError, match="Hugging Face tokenizer"):
        ChatTokens(base, object())


def test_check_env_passes(base, tokenizer):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*different from the unwrapped.*")
        check_env(ChatTokens(base, tokenizer), skip_render_check=True)
