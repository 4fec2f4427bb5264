"""An MCP environment: ``echo`` answers its message, ``describe`` answers a dict, ``guess`` finds
the hidden number, ``fail`` raises.

The hidden number is ``seed % 10`` (7 without a seed). A right guess gives reward 1.0 and ends
the episode, a wrong one 0.0; ``echo`` gives no reward (``None``).
"""

import uuid

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Observation, State


class EchoEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("echo_env")
        self.target = 7

        @mcp.tool
        def echo(message: str) -> str:
            """Echo the message back."""
            return message

        @mcp.tool
        def describe(word: str) -> dict:
            """The word's length and its letters, as a dict."""
            return {"word": word, "length": len(word), "letters": sorted(set(word))}

        @mcp.tool
        def guess(number: int) -> str:
            """Guess the hidden number (0-9)."""
            if number == self.target:
                return "correct"
            return "too low" if number < self.target else "too high"

        @mcp.tool
        def fail(reason: str) -> str:
            """Always raises."""
            raise ValueError(f"failed on purpose: {reason}")

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.target = 7 if seed is None else seed % 10
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return Observation(done=False, reward=None, metadata={"status": "ready", "hint": "guess a digit"})

    async def step_async(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction) and action.tool_name == "guess" and obs.error is None:
            correct = action.arguments.get("number") == self.target
            obs.reward = 1.0 if correct else 0.0
            obs.done = correct
        return obs

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(done=False, reward=None, metadata={"error": f"unknown action {type(action).__name__}"})

    @property
    def state(self):
        return self._state
