"""The TRL example's tests need torch and TRL, which live in their own venv (``.ci/trl.sh`` builds
it and runs them there); the main venv does not collect them rather than report them skipped."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("trl") else ["test_trl_grpo.py"]
