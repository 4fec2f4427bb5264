"""Envs whose agent answers in text (Verifiers), served with the ``respond`` tool: its ``content``
is the assistant's message. A multi-turn text env over ORS (the ors-sdk client) and a tool env
that also takes a text answer over OpenEnv's protocol (``MCPToolClient``), each compared step by
step with ``gym.make`` of the same id."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import pytest
from serve_helpers import CALC, GUESS, call, serve_process  # noqa: F401 (a fixture)

import openenv_gym  # noqa: F401

pytest.importorskip("verifiers")


def test_a_text_env_is_played_with_respond_over_ors(serve_process):
    from ors.client import ORS, ToolCallError

    served = serve_process(*GUESS, "--max-sessions", "2")
    source = GUESS[1].split("=", 1)[1]
    direct = gym.make(GUESS[0], source=source)
    try:
        with ORS(base_url=served.url, api_key=served.token) as client:
            env = client.environment("verifiers")
            for index, guesses in ((0, ["5", "2", "3"]), (2, ["nine", "10", "9", "9"])):
                obs, _ = direct.reset(options={"split": "train", "index": index})
                with env.session(split="train", index=index) as session:
                    assert [t.name for t in session.list_tools()] == ["respond"]
                    assert [b.text for b in session.get_prompt()] == [m["content"] for m in obs]
                    with pytest.raises(ToolCallError, match="content"):
                        session.call_tool("respond", {"text": "5"})  # not run: nothing stepped
                    ended = False
                    for guess in guesses:
                        if ended:
                            with pytest.raises(ToolCallError, match="finished"):
                                session.call_tool("respond", {"content": guess})
                            continue
                        said, reward, terminated, truncated, _ = direct.step(guess)
                        out = session.call_tool("respond", {"content": guess})
                        assert [b.text for b in out.blocks] == [m["content"] for m in said]
                        assert (out.reward, out.finished) == (reward, terminated or truncated)
                        ended = out.finished
                    assert ended and out.reward > 1.0  # solved, with the efficiency bonus
    finally:
        direct.close()
    assert served.stop() == 0


def test_a_tool_env_keeps_its_tools_and_also_takes_respond_over_openenv(serve_process):
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.mcp_client import MCPToolClient

    served = serve_process(*CALC, "--protocol", "openenv", "--max-sessions", "2")
    source = CALC[1].split("=", 1)[1]
    direct = gym.make(CALC[0], source=source)

    # The reference first (a legacy Verifiers env blocks on its own loop: not inside a running one).
    try:
        obs, _ = direct.reset(options={"split": "train", "index": 0})
        product = direct.step(call("multiply", {"a": 12, "b": 13}))
        answered = direct.step("156")
    finally:
        direct.close()

    async def play() -> None:
        async with MCPToolClient(base_url=served.url, headers=served.headers) as env:
            opening = await env.reset(split="train", index=0)
            assert opening.observation.metadata["prompt"] == obs
            assert [t.name for t in await env.list_tools()] == ["multiply", "boom", "respond"]
            result = await env.step(CallToolAction(tool_name="multiply", arguments={"a": 12, "b": 13}))
            assert result.observation.result["data"] == product[0][0]["content"] == "156"
            final = await env.step(CallToolAction(tool_name="respond", arguments={"content": "156"}))
            assert (final.reward, final.done) == (answered[1], answered[2]) == (1.0, True)

    asyncio.run(play())
    assert served.stop() == 0
