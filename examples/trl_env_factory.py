"""TRL's GRPOTrainer trained on openenv_gym environments through its ``environment_factory`` hook.

``openenv_gym.trl.EnvSpec`` gives the three arguments GRPOTrainer takes, with the members and
meanings of TRL's own ``trl.experimental.openreward.OpenRewardSpec`` (TRL 1.16.0), for any
openenv_gym id or a weighted mixture of ids::

    spec = EnvSpec("openenv/Arithmetic-v0", num_tasks=64)
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=spec.train_dataset,
                          environment_factory=spec.environment_factory, reward_funcs=spec.reward_funcs)

TRL builds one environment instance per rollout slot; each ``reset(**row)`` starts the row's task
and returns its prompt, the model's tool calls run as the env's steps (TRL masks their results out
of the loss), and the reward is the env's: ``get_reward()`` for an env with tools, the final
message played through the env for one that answers in plain text.

``--env`` picks what to train on: ``arithmetic`` (the bundled ORS env: a calculator and a submit
tool), ``sums`` (``examples/vf_sums.py``, a Verifiers env answered in plain text) or ``mixture``
(both, one dataset whose rows name their env; TRL's dict form of ``environment_factory``).

Offline (the default) the model is a tiny Qwen2 built from a config, with a byte-level BPE
tokenizer trained in memory and TRL's Qwen2.5 chat template (so TRL parses its tool calls):
nothing is downloaded. Such a model is untrained: it almost never writes a valid tool call or the
right sum, so rewards are 0 and the run shows the data path and the optimizer steps, not
learning. ``--model NAME`` trains a real chat model instead (``--use-vllm`` with
``trl vllm-serve`` running).

    python examples/trl_env_factory.py --env mixture --steps 2     # offline, tiny model, CPU
    python examples/trl_env_factory.py --env arithmetic --model Qwen/Qwen3-0.6B --use-vllm --steps 100

Install (a venv of its own: torch first, then ``pip install -e '.[ors,verifiers,trl]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen2_5_chat_template

from openenv_gym.registration import ADAPTERS, ENTRY_POINT, VECTOR_ENTRY_POINT
from openenv_gym.trl import EnvSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared tiny model of examples/trl_grpo.py
from trl_grpo import PrintFigures, tiny_model, tiny_tokenizer  # noqa: E402

ARITHMETIC = "openenv/Arithmetic-v0"
SUMS = "openenv/Sums-v0"
SUMS_SOURCE = Path(__file__).resolve().parent / "vf_sums.py"
ENVS: dict[str, Any] = {"arithmetic": ARITHMETIC, "sums": SUMS, "mixture": {ARITHMETIC: 1.0, SUMS: 1.0}}
CORPUS = ["Answer with the number only.", "What is 12 + 34? 46", "Correct! Incorrect.",
          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "(17 + 4) * 3"}}\n</tool_call>']


def register_sums() -> None:
    """``openenv/Sums-v0``: examples/vf_sums.py as an id (``openenv-gym import`` would keep it)."""
    if SUMS in gym.registry:
        return
    gym.register(SUMS, entry_point=ENTRY_POINT, vector_entry_point=VECTOR_ENTRY_POINT,
                 kwargs={"adapter": ADAPTERS["verifiers"], "source": str(SUMS_SOURCE)})


def build(args: argparse.Namespace) -> tuple[EnvSpec, Any, Any]:
    """The spec, the model and the tokenizer for ``args``."""
    register_sums()
    spec = EnvSpec(ENVS[args.env], num_tasks=args.tasks)
    if args.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tokenizer, model = AutoTokenizer.from_pretrained(args.model), AutoModelForCausalLM.from_pretrained(args.model)
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built here
        torch.manual_seed(args.seed)
        tokenizer = tiny_tokenizer(chat_template=qwen2_5_chat_template, corpus=CORPUS)
        model = tiny_model(tokenizer)
    return spec, model, tokenizer


def trainer_for(spec: EnvSpec, model: Any, tokenizer: Any, args: argparse.Namespace, output_dir: str) -> GRPOTrainer:
    config = GRPOConfig(
        output_dir=output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        num_generations=args.group_size, max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_tool_calls, learning_rate=args.learning_rate,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=not torch.cuda.is_available(),
        bf16=False, disable_tqdm=True, seed=args.seed, use_vllm=args.use_vllm, vllm_mode="server",
    )
    return GRPOTrainer(model=model, args=config, processing_class=tokenizer, train_dataset=spec.train_dataset,
                       environment_factory=spec.environment_factory, reward_funcs=spec.reward_funcs,
                       callbacks=[PrintFigures()])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", choices=sorted(ENVS), default="mixture", help="what to train on")
    p.add_argument("--model", help="a Hugging Face model to train (default: a tiny Qwen2 built offline)")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps")
    p.add_argument("--tasks", type=int, default=64, help="dataset rows (tasks)")
    p.add_argument("--group-size", type=int, default=2, help="num_generations: rollouts per task")
    p.add_argument("--batch-size", type=int, default=4, help="rollouts per optimizer step")
    p.add_argument("--max-completion-length", type=int, default=96, help="tokens per rollout, tool results included")
    p.add_argument("--max-tool-calls", type=int, default=3, help="max_tool_calling_iterations")
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--use-vllm", action="store_true", help="generate with TRL's vLLM server mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write TRL's log history here")
    return p


def main(argv: list[str] | None = None) -> GRPOTrainer:
    args = parser().parse_args(argv)
    spec, model, tokenizer = build(args)
    import tempfile

    with spec, tempfile.TemporaryDirectory() as out:
        trainer = trainer_for(spec, model, tokenizer, args, out)
        start = time.perf_counter()
        trainer.train()
    print(f"done: {trainer.state.global_step} optimizer steps on {args.env}, {time.perf_counter() - start:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"global_step": trainer.state.global_step, "log_history": trainer.state.log_history}, f,
                      indent=1)
    return trainer


if __name__ == "__main__":
    main()
