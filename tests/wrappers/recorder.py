"""A wrapper the wrapper tests put below the one under test: it records what the inner env is sent."""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest

import openenv_gym  # noqa: F401  (registers the ids)


class Recorder(gym.Wrapper):
    """Records (a deep copy of) every action passed to the inner env's ``step``."""

    def __init__(self, env):
        super().__init__(env)
        self.actions: list = []

    def step(self, action):
        self.actions.append(copy.deepcopy(action))
        return self.env.step(action)


@pytest.fixture(scope="module")
def base():
    """One Arithmetic env per test module, under the wrapper being tested."""
    env = gym.make("openenv/Arithmetic-v0")
    yield env
    env.close()
