#!/usr/bin/env bash
# CI for examples/trl_grpo.py: TRL's GRPOTrainer on openenv/Arithmetic-v0 through its rollout_func
# hook, with a tiny model built offline, on the CPU. Its own venv (.venv-trl): torch 2.13.0 CPU
# first (pinned with +cpu so pip fails fast rather than fetch a CUDA build), then the `trl` extra;
# about 80 s to install from nothing on the 2-core CI machine. Prints the example's figures for two
# optimizer steps, then runs its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off TRL_EXPERIMENTAL_SILENCE=1
python3 -m venv .venv-trl
.venv-trl/bin/pip install -q 'torch==2.13.0+cpu'
.venv-trl/bin/pip install -q -e '.[ors,trl,dev]'
.venv-trl/bin/python -c "import importlib.metadata as m; print(*(f'{p} {m.version(p)}' for p in ('torch', 'trl', 'transformers')), sep=', ')"
.venv-trl/bin/python examples/trl_grpo.py --steps 2
.venv-trl/bin/pytest -q tests/examples/test_trl_grpo.py
