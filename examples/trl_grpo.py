"""TRL's GRPOTrainer trained on an openenv_gym environment through its ``rollout_func`` hook.

TRL (pinned: 1.16.0) calls ``rollout_func(prompts, trainer) -> dict`` once per generation batch,
instead of generating itself. ``prompts`` is this process's slice of the batch, in which TRL's
sampler has already repeated each dataset row ``num_generations`` times, consecutively; the
function returns one completion per prompt, as lists: ``prompt_ids``, ``completion_ids`` and
``logprobs`` (required), ``env_mask`` (optional: 1 on tokens the model wrote, 0 on tokens the
environment wrote, which the loss skips) and any other key, forwarded to the reward functions as a
keyword argument. TRL then scores, computes group advantages over each run of ``num_generations``
and takes its optimizer steps.

Here each such run of ``k = num_generations`` prompts becomes one group of
``gym.make_vec("openenv/Arithmetic-v0", num_envs=len(prompts), group_size=k)``: the ``k`` members
play the same task (the environment, not the dataset, chooses it; a dataset row only carries the
system prompt), so TRL's group advantages compare attempts at one task. ``rollout.run`` plays the
episodes first-ready, turn by turn, with :class:`TrainerPolicy`, which generates every assistant
turn with the model being trained. A multi-turn episode is returned as one sample: the first
turn's prompt, then every turn's completion with the environment's replies in between (``env_mask``
0). Each turn's prompt is the previous prompt plus its completion plus the environment's reply,
concatenated as token ids, so nothing the model wrote is ever re-tokenised. The reward function
reads the environment's reward (``env_reward``, forwarded by the hook).

Generation: with ``--use-vllm`` (``trl vllm-serve`` running), TRL's own vLLM client generates and
TRL syncs the weights before each rollout; otherwise ``transformers`` generates with the trained
model. Offline (the default) the model is a tiny Qwen2 built from a config with a byte-level BPE
tokenizer trained in memory: nothing is downloaded. Such a model is untrained, so it almost never
writes a valid tool call, every reward is 0 and so are the advantages: the run shows the data path
and the optimizer steps, not learning. ``--model NAME`` trains a real chat model instead.

    python examples/trl_grpo.py --steps 2                 # offline, tiny model, CPU
    python examples/trl_grpo.py --model Qwen/Qwen2.5-0.5B-Instruct --use-vllm --steps 100

Install (a separate venv is best: torch first, then ``pip install -e '.[ors,trl]'``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.models import unwrap_model_for_generation

import openenv_gym  # noqa: F401  (registers openenv/Arithmetic-v0)
from openenv_gym import rollout
from openenv_gym.wrappers import parse_tool_text

ENV_ID = "openenv/Arithmetic-v0"
SYSTEM = "You are a careful agent. Use the tools to compute the answer, then submit it."

# ChatML with Hermes-style tool calls, as Qwen2.5 writes them. Newlines are written as '\n'
# expressions: Transformers renders templates with trim_blocks, which eats a newline after a tag.
CHAT_TEMPLATE = (
    "{% if tools or messages[0].role == 'system' %}{{ '<|im_start|>system\\n' }}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "{% if tools %}{{ '\\nTools: ' + (tools | tojson) + '\\nCall one as <tool_call>"
    "{\"name\": ..., \"arguments\": {...}}</tool_call>' }}{% endif %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}{% if not (loop.first and m.role == 'system') %}"
    "{{ '<|im_start|>' + m.role + '\\n' }}{% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments if c.function.arguments is string else c.function.arguments | tojson }}}"
    "</tool_call>{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_tokenizer(vocab_size: int = 512, chat_template: str = CHAT_TEMPLATE,
                   corpus: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained in memory: any text encodes, nothing is downloaded.

    ``chat_template``: the template it renders conversations with; ``corpus``: more text to train
    its merges on (the env's wording, so prompts stay short)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [SYSTEM, chat_template, "Compute 12 * (7 - 3) + 45. You may use the `calculator` tool for "
              "intermediate steps. When done, call `submit` with the final integer answer.",
              '<tool_call>{"name": "calculator", "arguments": {"expression": "(17 + 4) * 3"}}</tool_call>',
              '<tool_call>{"name": "submit", "arguments": {"answer": "63"}}</tool_call> Correct! Incorrect.',
              *corpus]
    tok.train_from_iterator(corpus * 8, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=chat_template)


def tiny_model(tokenizer: PreTrainedTokenizerFast, hidden: int = 64, layers: int = 2) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 small enough to train on a CPU in seconds."""
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return Qwen2ForCausalLM(config)


def parse_tool_calls(text: str) -> str | dict[str, Any]:
    """The Hermes ``<tool_call>{json}</tool_call>`` calls in a completion as an OpenAI assistant
    message (what the env reads); text without readable calls goes to the env as it is, and the
    env tells the model what was wrong."""
    found = parse_tool_text(text, formats=("hermes",))
    return {"role": "assistant", "content": found.content, "tool_calls": found.calls} if found.calls else text


def generate(trainer: GRPOTrainer, prompts: list[list[int]],
             max_new_tokens: int) -> tuple[list[list[int]], list[list[float]]]:
    """Sample one completion per prompt with the model being trained: ids and their logprobs."""
    if trainer.use_vllm:  # TRL's vLLM (server or colocate); TRL synced the weights before the rollout
        _, ids, logprobs, _ = trainer.vllm_generation.generate(prompts=prompts, images=None, num_generations=1)
        return ids, [[lp[0] for lp in seq] for seq in logprobs]
    tok = trainer.processing_class
    width = max(map(len, prompts))
    input_ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = copy.copy(trainer.generation_config)  # TRL's sampling settings, this turn's token limit
    config.update(max_new_tokens=max_new_tokens, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad(), unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device),
                             generation_config=config)
    new = out.sequences[:, width:].cpu()
    # The scores are the processed logits the tokens were sampled from (temperature, top-k/p).
    logps = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, new.unsqueeze(-1).to(out.scores[0].device))
    eos = set(trainer.eos_token_ids)
    ids, logprobs = [], []
    for row, row_logps in zip(new.tolist(), logps.squeeze(-1).cpu().tolist()):
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))  # keep the first EOS, drop padding
        ids.append(row[:end])
        logprobs.append(row_logps[:end])
    return ids, logprobs


class TrainerPolicy:
    """An openenv_gym policy (``reset``/``act_batch``/``tokens``) that generates with the trainer.

    Each sub-env's prompt grows by concatenation: previous prompt + completion + the template's
    rendering of what the env said, so the ids of turn t+1 always start with those of turn t.
    """

    def __init__(self, trainer: GRPOTrainer, max_turn_tokens: int):
        self.trainer, self.tok, self.max_turn_tokens = trainer, trainer.processing_class, max_turn_tokens
        self.prefix: list[list[dict[str, Any]]] = []
        self.history: dict[int, list[dict[str, Any]]] = {}
        self.tools: dict[int, list[dict[str, Any]] | None] = {}
        self.last: dict[int, dict[str, Any]] = {}

    def begin(self, prompts: list[list[dict[str, Any]]]) -> None:
        """The dataset's messages for each sub-env (sub-env ``i`` answers TRL's prompt ``i``)."""
        self.prefix = prompts

    def reset(self, env_id: int, observation: list[dict[str, Any]], info: dict[str, Any]) -> None:
        self.history[env_id] = list(self.prefix[env_id]) + list(observation)
        self.tools[env_id] = info.get("tools")
        self.last.pop(env_id, None)

    def _render(self, env_id: int, messages: list[dict[str, Any]], open_turn: bool) -> str:
        return self.tok.apply_chat_template(messages, tools=self.tools[env_id], tokenize=False,
                                            add_generation_prompt=open_turn)

    def _prompt(self, env_id: int, observation: list[dict[str, Any]]) -> list[int]:
        last = self.last.get(env_id)
        if last is None:  # the episode's first turn: the whole prompt from the template
            return self.tok(self._render(env_id, self.history[env_id], True), add_special_tokens=False).input_ids
        before = self._render(env_id, self.history[env_id], False)
        self.history[env_id].extend(observation)
        after = self._render(env_id, self.history[env_id], True)
        if not after.startswith(before):
            raise RuntimeError("the chat template rewrites earlier turns: turn-by-turn ids cannot be concatenated")
        eos = self.tok.eos_token
        if eos not in before:
            raise RuntimeError(f"the chat template does not end assistant turns with {eos!r}")
        # What the template writes after the assistant's end-of-turn token belongs to the env's part.
        reply = before[before.rindex(eos) + len(eos):] + after[len(before):]
        if last["completion_token_ids"][-1:] != [self.tok.eos_token_id]:
            reply = eos + reply  # the turn hit its token limit: close it as the template would
        reply_ids = self.tok(reply, add_special_tokens=False).input_ids
        return last["prompt_token_ids"] + last["completion_token_ids"] + reply_ids

    def act_batch(self, env_ids: Sequence[int], observations: Sequence[list[dict[str, Any]]],
                  infos: Sequence[dict[str, Any]]) -> list[Any]:
        prompts = [self._prompt(i, obs) for i, obs in zip(env_ids, observations)]
        completions, logprobs = generate(self.trainer, prompts, self.max_turn_tokens)
        actions = []
        for i, prompt, ids, logp in zip(env_ids, prompts, completions, logprobs):
            self.last[i] = {"prompt_token_ids": prompt, "completion_token_ids": ids, "logprobs": logp}
            action = parse_tool_calls(self.tok.decode(ids, skip_special_tokens=True))
            self.history[i].append(action if isinstance(action, dict) else {"role": "assistant", "content": action})
            actions.append(action)
        return actions

    def tokens(self, env_id: int) -> dict[str, Any] | None:
        return self.last.get(env_id)

    def close(self) -> None:
        pass


def episode_sample(record: dict[str, Any]) -> tuple[list[int], list[int], list[float], list[int]]:
    """One TRL sample from an episode: first prompt; completions with env replies masked out."""
    prompts, completions, logprobs = record["prompt_token_ids"], record["completion_token_ids"], record["logprobs"]
    ids, logps, mask = [], [], []
    for t, (prompt, completion, logp) in enumerate(zip(prompts, completions, logprobs)):
        if t:  # the env's reply: what this prompt adds to the previous prompt and completion
            reply = prompt[len(prompts[0]) + len(ids):]
            ids, logps, mask = ids + reply, logps + [0.0] * len(reply), mask + [0] * len(reply)
        ids, logps, mask = ids + completion, logps + logp, mask + [1] * len(completion)
    return prompts[0], ids, logps, mask


class EnvRollout:
    """The ``rollout_func``: plays TRL's prompts as grouped episodes of ``env_id``."""

    def __init__(self, env_id: str, max_turns: int, max_turn_tokens: int, seed: int):
        self.env_id, self.max_turns, self.max_turn_tokens, self.seed = env_id, max_turns, max_turn_tokens, seed
        self.envs: Any = None
        self.policy: TrainerPolicy | None = None
        self.calls = 0

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, list]:
        n = len(prompts)
        k = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        if self.envs is None or self.envs.num_envs != n or self.envs.group_size != k:
            self.close()
            self.envs = gym.make_vec(self.env_id, num_envs=n, group_size=k, autoreset_mode="SameStep",
                                     max_turns=self.max_turns)
            self.policy = TrainerPolicy(trainer, self.max_turn_tokens)
        self.policy.begin(prompts)
        records: list[dict[str, Any] | None] = [None] * n

        def keep(record: dict[str, Any]) -> None:
            # n sub-envs, n episodes: each sub-env plays one, so sub-env i answers prompt i, and a
            # run of k prompts is one env group (one task).
            records[record["env_id"]] = record

        # A new seed per call: each generation batch draws new tasks.
        rollout.run(self.envs, self.policy, n, seed=self.seed + self.calls, batch_size=n, on_episode=keep)
        self.calls += 1
        assert all(r is not None for r in records), "every sub-env plays exactly one episode"
        samples = [episode_sample(r) for r in records]
        assert all(len(ids) == len(logps) == len(mask) for _, ids, logps, mask in samples)
        return {
            "prompt_ids": [s[0] for s in samples], "completion_ids": [s[1] for s in samples],
            "logprobs": [s[2] for s in samples], "env_mask": [s[3] for s in samples],
            "env_reward": [r["total_reward"] for r in records], "task_id": [r["task_id"] for r in records],
        }

    def close(self) -> None:
        if self.envs is not None:
            self.envs.close()
            self.envs = None


def env_reward(completions: list[Any], env_reward: list[float], **kwargs: Any) -> list[float]:
    """The reward is the environment's: the episode's total reward, forwarded by the rollout."""
    return [float(r) for r in env_reward]


class PrintFigures(TrainerCallback):
    """One line per logged step: loss, reward, step time and the like."""

    KEYS = ("loss", "reward", "reward_std", "grad_norm", "step_time", "completions/mean_length", "num_tokens")

    def on_log(self, args, state, control, logs=None, **kwargs):
        shown = {k: logs[k] for k in self.KEYS if logs and k in logs}
        if shown:
            print(f"step {state.global_step}: " + ", ".join(f"{k} {v:.4g}" for k, v in shown.items()), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a Hugging Face model to train (default: a tiny Qwen2 built offline)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps")
    parser.add_argument("--group-size", type=int, default=2, help="num_generations: episodes per task")
    parser.add_argument("--batch-size", type=int, default=4, help="episodes per optimizer step")
    parser.add_argument("--max-turns", type=int, default=3, help="turns per episode")
    parser.add_argument("--max-turn-tokens", type=int, default=24, help="tokens per assistant turn")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--use-vllm", action="store_true", help="generate with TRL's vLLM server mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write TRL's log history here")
    args = parser.parse_args(argv)

    if args.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tokenizer, model = AutoTokenizer.from_pretrained(args.model), AutoModelForCausalLM.from_pretrained(args.model)
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built here
        torch.manual_seed(args.seed)
        tokenizer = tiny_tokenizer()
        model = tiny_model(tokenizer)
    rows = args.steps * args.batch_size // args.group_size
    dataset = Dataset.from_dict({"prompt": [[{"role": "system", "content": SYSTEM}]] * rows})
    rollout_func = EnvRollout(ENV_ID, args.max_turns, args.max_turn_tokens, args.seed)
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
            num_generations=args.group_size, max_completion_length=args.max_turns * args.max_turn_tokens,
            learning_rate=args.learning_rate, logging_steps=1, save_strategy="no", report_to="none",
            use_cpu=not torch.cuda.is_available(), bf16=False, disable_tqdm=True, seed=args.seed,
            use_vllm=args.use_vllm, vllm_mode="server",
        )
        trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, rollout_func=rollout_func, callbacks=[PrintFigures()])
        start = time.perf_counter()
        try:
            trainer.train()
        finally:
            rollout_func.close()
    print(f"done: {trainer.state.global_step} optimizer steps, {rollout_func.calls} rollouts of "
          f"{args.batch_size} episodes, {time.perf_counter() - start:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"global_step": trainer.state.global_step, "rollouts": rollout_func.calls,
                       "log_history": trainer.state.log_history}, f, indent=1)


if __name__ == "__main__":
    main()
