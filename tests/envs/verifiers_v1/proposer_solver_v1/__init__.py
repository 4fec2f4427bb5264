# verifiers' own proposer_solver_v1 (environments/proposer_solver_v1 at tag v0.3.0), copied unchanged as a test fixture.
# MIT License, Copyright (c) 2026 Prime Intellect.
from proposer_solver_v1.taskset import (
    ProposerSolverEnv,
    ProposerSolverEnvConfig,
    ProposerSolverTaskset,
)

__all__ = ["ProposerSolverEnv", "ProposerSolverEnvConfig", "ProposerSolverTaskset"]
