"""A wrapper the wrapper tests put below the one under test: it records what the inner env is sent."""

from __future__ import annotations

import copy

import gymnasium as gym


class Recorder(gym.Wrapper):
    """Records (a deep copy of) every action passed to the inner env's ``step``."""

    def __init__(self, env):
        super().__init__(env)
        self.actions: list = []

    def step(self, action):
        self.actions.append(copy.deepcopy(action))
        return self.env.step(action)
