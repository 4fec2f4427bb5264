# verifiers' own kuhn_poker_v1 (environments/kuhn_poker_v1 at tag v0.3.0), copied unchanged as a test fixture.
# MIT License, Copyright (c) 2026 Prime Intellect.
from kuhn_poker_v1.taskset import KuhnPokerEnv, KuhnPokerTaskset

__all__ = ["KuhnPokerEnv", "KuhnPokerTaskset"]
