"""examples/selfplay_kuhn.py, run as a user runs it (a subprocess, offline with the bundled stub
and its table model): both seats of every hand become training samples with token ids and a
per-seat advantage, and the trainer's step moves the policy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pettingzoo", reason="the multiagent extra is not installed")
from openenv_gym.adapters.verifiers import v1 as v1mod  # noqa: E402
from openenv_gym.errors import ConfigurationError  # noqa: E402

try:
    v1mod._import_v1()
except ConfigurationError as _exc:
    pytest.skip(f"verifiers.v1 is not usable here: {_exc}", allow_module_level=True)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "selfplay_kuhn.py"


@pytest.mark.slow
def test_self_play_trains_on_both_seats_of_every_hand(tmp_path: Path) -> None:
    out, figures = tmp_path / "samples.jsonl", tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--iterations", "2", "--games", "4", "--group-size", "2",
                           "--lr", "2", "--out", str(out), "--json", str(figures)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = json.loads(figures.read_text())
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(history) == 2
    for it in history:
        assert it["games"] >= 4 and it["truncated"] == 0
        assert it["samples"]["player0"] > 0 and it["samples"]["player1"] > 0  # both seats train
        assert it["mean_reward"]["player0"] == -it["mean_reward"]["player1"]  # zero-sum, every hand both seats
    by_game: dict[str, set] = {}
    for s in samples:
        by_game.setdefault(s["game_id"], set()).add(s["seat"])
        assert s["prompt_ids"] and s["completion_ids"] and s["logprobs"]  # what the model server returned
        assert s["move"] in ("check", "bet", "call", "fold") and isinstance(s["advantage"], float)
    assert all(seats == {"player0", "player1"} for seats in by_game.values())
    assert any(s["advantage"] != 0 for s in samples)
    last = history[-1]
    # The table started at 0.5 everywhere; the step moved it (wherever a hand reached the spot).
    assert (last["P(call a bet with J)"], last["P(fold a bet with K)"]) != (0.5, 0.5)
