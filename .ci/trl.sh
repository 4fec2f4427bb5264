#!/usr/bin/env bash
# CI for TRL's GRPOTrainer driving openenv_gym, with a tiny model built offline, on the CPU:
# examples/trl_grpo.py (the rollout_func hook) and examples/trl_env_factory.py (environment_factory
# through openenv_gym.trl.EnvSpec, on Arithmetic, a Verifiers env and a mixture), then their tests.
# Its own venv (.venv-trl): torch 2.13.0 first, then the extras.
#
# torch: `pip install torch==2.13.0` takes that release from PyPI, whose wheel is a CPU build on
# aarch64 and macOS and a CUDA build on Linux x86_64 (several GB with its nvidia-* packages; it runs
# on the CPU too). A pip configured with a local CPU wheel of 2.13.0 (find-links) takes that one:
# `==2.13.0` admits the `2.13.0+cpu` local version and pip prefers it. For the CPU build on Linux
# x86_64 from PyTorch's own CPU index, set TORCH_INDEX_URL to that index (docs/training.md,
# "Training with TRL"); nothing else is fetched from it.
#
# `bash .ci/trl.sh` does both; `install` only builds the venv, `run` only runs (CI builds it in the
# background while other steps run).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off TRL_EXPERIMENTAL_SILENCE=1
phase="${1:-all}"
case "$phase" in all|install|run) ;; *) echo "usage: $0 [install|run]" >&2; exit 2 ;; esac
if [[ "$phase" != run ]]; then
  python3 -m venv .venv-trl
  torch=(torch==2.13.0)
  if [[ -n "${TORCH_INDEX_URL:-}" ]]; then torch+=(--index-url "$TORCH_INDEX_URL"); fi
  pins=openenv_gym/constraints/py3.11.txt  # the tested set (.ci/pins.py)
  .venv-trl/bin/pip install -q -c "$pins" "${torch[@]}"
  .venv-trl/bin/pip install -q -c "$pins" -e '.[ors,verifiers,trl,dev]'
fi
[[ "$phase" != install ]] || exit 0
.venv-trl/bin/python -c "import importlib.metadata as m, torch; print(*(f'{p} {m.version(p)}' for p in ('torch', 'trl', 'transformers', 'verifiers')), 'CUDA build' if torch.version.cuda else 'CPU build', sep=', ')"
.venv-trl/bin/python examples/trl_grpo.py --steps 2
.venv-trl/bin/python examples/trl_env_factory.py --env mixture --steps 2
.venv-trl/bin/pytest -q tests/examples/test_trl_grpo.py tests/examples/test_trl_env_factory.py
