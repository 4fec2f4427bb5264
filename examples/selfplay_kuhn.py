"""Self-play on both seats of Kuhn poker: one policy plays every seat of many games, and learns from both.

This is the loop a self-play trainer (SPIRAL-style: one shared policy, per-seat baselines) runs
against ``openenv/KuhnPoker-v0``, verifiers' own ``kuhn_poker_v1`` bundled with the package:

* ``vector_env(ID, num_games, group_size=k)`` plays many games at once, first-ready over
  (game, seat) pairs: whichever seat of whichever game is ready is answered next, so a slow game
  never holds the others up. A group's ``k`` games deal the same hand.
* Every seat is answered by the same policy, an OpenAI-compatible model called with
  ``OpenAIPolicy(token_ids=True)``: each turn's prompt and completion token ids and logprobs go
  into the seat's record (``send(actions, tokens=...)``).
* Every finished seat leaves its own record, with its advantage over the same seat of its group's
  games (same hand, same seat: the per-seat baseline a zero-sum game needs). Both seats of every
  hand become training samples, one per assistant turn.

Offline (default), the "model" is a table of move probabilities per (seat, card, situation),
served by the package's OpenAI-compatible stub; the trainer's step is REINFORCE on that table
with the samples' advantages, so the script really trains, in minutes on a laptop, and prints
what it learned: calling a bet with the jack (always a loss) and folding the king (never right)
go down. In real use, point ``--base-url`` at vLLM and hand the samples to your trainer
(the token ids are in each sample)::

    python examples/selfplay_kuhn.py --iterations 4 --games 16 --group-size 4   # offline, minutes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import re
import threading
import time
from typing import Any

import numpy as np

import openenv_gym  # noqa: F401  (registers openenv/KuhnPoker-v0)
from openenv_gym.multiagent import vector_env
from openenv_gym.policies import OpenAIPolicy
from openenv_gym.testing.openai_stub import OpenAIStub

ENV_ID = "openenv/KuhnPoker-v0"
_CARD = re.compile(r"Your private card: ([JQK])")
_LEGAL = re.compile(r"Your legal actions: (.*)\.")
_MOVE = re.compile(r"\[(check|bet|call|fold)\]")
_SEAT = re.compile(r"playing Kuhn poker as Player (\d)")


def _text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))


def situation(seat: str, messages: list[dict[str, Any]]) -> tuple[str, str, tuple[str, ...]] | None:
    """What the seat decides on: its seat, its card and its legal moves (the last ones offered)."""
    seen = _text(messages)
    card, legal = _CARD.search(seen), _LEGAL.findall(seen)
    if card is None or not legal:
        return None
    return seat, card[1], tuple(_MOVE.findall(legal[-1]))


class TableModel:
    """The offline "model": a softmax over the legal moves of each situation. Thread-safe, since
    the stub answers requests on threads while the trainer updates it."""

    def __init__(self, seed: int):
        self.logits: dict[tuple[Any, ...], dict[str, float]] = {}
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def probs(self, key: tuple[str, str, tuple[str, ...]]) -> dict[str, float]:
        with self._lock:
            table = self.logits.setdefault(key, {m: 0.0 for m in key[2]})
            top = max(table.values())
            weights = {m: math.exp(v - top) for m, v in table.items()}
        total = sum(weights.values())
        return {m: w / total for m, w in weights.items()}

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The stub's script: the seat's move, sampled from the table."""
        messages = body["messages"]
        who = _SEAT.search(_text(messages[:1]))
        seat = f"player{who[1]}" if who else "player0"
        key = situation(seat, messages)
        if key is None:
            return {"role": "assistant", "content": "[check]"}
        probs = self.probs(key)
        with self._lock:
            move = self._rng.choices(list(probs), weights=list(probs.values()))[0]
        return {"role": "assistant", "content": f"I {move}. [{move}]"}

    def step(self, samples: list[dict[str, Any]], lr: float) -> None:
        """REINFORCE on the table: each sample's move made more (or less) likely by its advantage."""
        for s in samples:
            key, move = s["situation"], s["move"]
            if key is None or move is None or s["advantage"] == 0:
                continue
            probs = self.probs(key)
            with self._lock:
                for m in self.logits[key]:
                    grad = (1.0 if m == move else 0.0) - probs[m]
                    self.logits[key][m] += lr * s["advantage"] * grad


def samples_of(record: Any) -> list[dict[str, Any]]:
    """One training sample per assistant turn of a seat's record: the prompt the seat saw up to
    that turn, its move, its token ids, and the seat's advantage."""
    out, seen = [], []
    turn = 0
    for message in record.messages:
        if message["role"] != "assistant":
            seen.append(message)
            continue
        moved = _MOVE.search(message.get("content") or "")
        out.append({"seat": record.seat, "game_id": record.game_id, "task": record.index,
                    "reward": record.total_reward, "advantage": record.advantage,
                    "situation": situation(record.seat, seen), "move": moved[1] if moved else None,
                    "prompt_ids": (record.prompt_token_ids or [None] * (turn + 1))[turn],
                    "completion_ids": (record.completion_token_ids or [None] * (turn + 1))[turn],
                    "logprobs": (record.logprobs or [None] * (turn + 1))[turn]})
        seen.append(message)
        turn += 1
    return out


def play(envs: Any, policy: OpenAIPolicy, seats: list[str], games: int, seed: int) -> list[Any]:
    """Play until ``games`` games are over (every seat's record in); the records."""
    ids = {s: k for k, s in enumerate(seats)}
    key_of = {}
    records: list[Any] = []
    ready = envs.reset(seed=seed)
    while len({r.game_id for r in records}) < games or len(records) % len(seats):
        live = [r for r in ready if not (r.terminated or r.truncated)]
        actions, tokens = {}, {}
        if live:
            pid = [r.game * len(seats) + ids[r.seat] for r in live]
            for p, r in zip(pid, live):
                if key_of.get(p) != r.info["game_id"]:  # the seat's first turn in a new game
                    key_of[p] = r.info["game_id"]
                    policy.reset(p, list(r.observation), r.info)
            for p, r, action in zip(pid, live, policy.act_batch(pid, [list(r.observation) for r in live],
                                                                [r.info for r in live])):
                actions[(r.game, r.seat)] = action
                tokens[(r.game, r.seat)] = policy.tokens(p)
        ready = envs.step(actions, tokens)
        records += envs.pop_records()
    return records


def describe(model: TableModel) -> dict[str, float]:
    """What the table does where Kuhn poker's answer is known, averaged over both seats."""
    def p(card: str, move: str) -> float:
        return float(np.mean([model.probs((seat, card, ("fold", "call")))[move] for seat in ("player0", "player1")]))
    return {"P(call a bet with J)": p("J", "call"), "P(fold a bet with K)": p("K", "fold")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible server (default: the bundled stub with a table model)")
    parser.add_argument("--model", default="stub")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--games", type=int, default=16, help="games at once (a multiple of --group-size)")
    parser.add_argument("--group-size", type=int, default=4, help="games per group (same hand)")
    parser.add_argument("--lr", type=float, default=1.0, help="the table's learning rate (offline only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write every training sample as a JSON line here")
    parser.add_argument("--json", help="write the per-iteration figures here")
    args = parser.parse_args(argv)

    model = TableModel(args.seed)
    history = []
    with contextlib.ExitStack() as stack:  # whatever started is stopped, in reverse, however the loop ends
        stub = stack.enter_context(OpenAIStub(model.answer)) if args.base_url is None else None
        policy = OpenAIPolicy(args.base_url or stub.url, args.model, token_ids=True)
        stack.callback(policy.close)
        envs = vector_env(ENV_ID, args.games, group_size=args.group_size)
        stack.callback(envs.close)
        out = stack.enter_context(open(args.out, "w")) if args.out else None
        print(f"{ENV_ID}: {args.games} games at once in groups of {args.group_size}, seats {envs.possible_agents}, "
              f"model {args.model!r} at {'the bundled stub (a table)' if stub else args.base_url}")
        if stub:
            print("before:", json.dumps({k: round(v, 3) for k, v in describe(model).items()}))
        for iteration in range(args.iterations):
            start = time.perf_counter()
            records = play(envs, policy, envs.possible_agents, args.games, args.seed + 1000 * iteration)
            samples = [s for r in records if r.advantage is not None for s in samples_of(r)]
            if out is not None:
                out.writelines(json.dumps({k: v for k, v in s.items() if k != "situation"}) + "\n" for s in samples)
            if stub:
                model.step(samples, args.lr)  # the trainer's policy-gradient step
            figures: dict[str, Any] = {
                "iteration": iteration, "games": len({r.game_id for r in records}),
                "samples": {seat: sum(s["seat"] == seat for s in samples) for seat in envs.possible_agents},
                "mean_reward": {seat: float(np.mean([r.total_reward for r in records if r.seat == seat]))
                                for seat in envs.possible_agents},
                "tokens": sum(len(s["prompt_ids"] or []) + len(s["completion_ids"] or []) for s in samples),
                "nonzero_advantages": sum(s["advantage"] != 0 for s in samples),
                "truncated": sum(r.truncated for r in records), "seconds": round(time.perf_counter() - start, 2),
            }
            if stub:
                figures.update({k: round(v, 3) for k, v in describe(model).items()})
            history.append(figures)
            print(json.dumps(figures), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(history, f, indent=1)


if __name__ == "__main__":
    main()
