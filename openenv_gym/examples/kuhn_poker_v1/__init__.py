# verifiers' own kuhn_poker_v1 (environments/kuhn_poker_v1 at tag v0.3.0), copied unchanged: the bundled multi-agent example (openenv/KuhnPoker-v0).
# MIT License, Copyright (c) 2026 Prime Intellect.
from kuhn_poker_v1.taskset import KuhnPokerEnv, KuhnPokerTaskset

__all__ = ["KuhnPokerEnv", "KuhnPokerTaskset"]
