"""The round trip: a served id played again through openenv_gym's own ORS and OpenEnv adapters
(``gym.make("openenv/ORS-v0", url=served)``, ``gym.make("openenv/OpenEnv-v0", url=served)``) passes
Gymnasium's ``check_env`` and gives what ``gym.make`` of the id itself gives, step by step: the
same openings, tool results, rewards and episode ends on the same seeds."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from serve_helpers import ARITHMETIC, call, expression, serve_process, start_serve  # noqa: F401 (a fixture)

import openenv_gym  # noqa: F401

ROUND_TRIP = {"ors": "openenv/ORS-v0", "openenv": "openenv/OpenEnv-v0"}


@pytest.fixture(scope="module", params=["ors", "openenv"])
def served(request):
    process = start_serve(ARITHMETIC, "--protocol", request.param, "--max-sessions", "8")
    yield request.param, process
    assert process.stop() == 0


def play(env: gym.Env, seed: int) -> list[tuple]:
    """A scripted episode with a wrong call, text, a tool result, a wrong submit: every step's outcome."""
    obs, info = env.reset(seed=seed)
    out = [(obs, info["index"])]
    value = None
    for action in (call("nope"), "I think it is 4.", call("calculator", {"expression": expression(obs[0]["content"])}),
                   None):
        if action is None:
            action = call("submit", {"answer": str(int(value) + 1)})
        said, reward, terminated, truncated, _ = env.step(action)
        if said and said[0].get("name") == "calculator":
            value = said[0]["content"]
        out.append(([m["content"] for m in said], reward, terminated, truncated))
    return out


def test_served_id_round_trips_through_our_own_adapters(served):
    protocol, process = served
    direct = gym.make(ARITHMETIC)
    env = gym.make(ROUND_TRIP[protocol], url=process.url, headers=process.headers)
    try:
        # The token is a secret kwarg, so env.spec holds it redacted and cannot remake the env:
        # check_env's close check (a remake from env.spec) is the one left out; test_uds_round_trip runs it whole.
        check_env(env.unwrapped, skip_render_check=True, skip_close_check=True)
        for seed in (1, 2, 40):
            assert play(env, seed) == play(direct, seed)
        assert [t["function"]["name"] for t in env.reset(seed=0)[1]["tools"]] == ["calculator", "submit"]
    finally:
        env.close()
        direct.close()


def test_uds_round_trip_passes_check_env_whole(serve_process, tmp_path):
    """On a Unix socket the URL is all a client needs (no token), so check_env runs every check."""
    socket = tmp_path / "served.sock"
    process = serve_process(ARITHMETIC, "--uds", str(socket), "--max-sessions", "4", token=None)
    assert process.url == f"unix:{socket}" and process.token is None
    assert socket.stat().st_mode & 0o777 == 0o600
    env = gym.make("openenv/ORS-v0", url=process.url)
    direct = gym.make(ARITHMETIC)
    try:
        check_env(env.unwrapped, skip_render_check=True)
        assert play(env, 5) == play(direct, 5)
    finally:
        env.close()
        direct.close()
    assert process.stop() == 0
    assert not socket.exists()
