"""The cycle's parameters, in a module light enough for the webhook to import
(no torch, vLLM or GX): Prefect validates a run's parameters against this model.

A run's sizes (`tasks_per_round`, ...) are optional: given, they override the
`[cycle]` setting they name (OVERRIDES) for this run only; left out, flywheel.toml (or
the stage's default) decides.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# parameter -> the [cycle] setting it overrides
OVERRIDES = {
    "tasks_per_round": "rollout.tasks_per_round",
    "samples_per_task": "rollout.engine.n",
    "train_steps": "train.grpo.steps",
    "eval_samples": "evaluate.engine.n",
    "max_staleness": "rollout.max_staleness",
}


class CycleParams(BaseModel):
    """What one cycle does; validated when a run is created (UI, webhook, CLI)."""

    model_config = ConfigDict(extra="forbid")
    cycle_id: str | None = Field(None, description="Reuse to resume a failed cycle; default: a new id.")
    landing: list[str] = Field(default_factory=list,
                               description="Files, folders or s3:// prefixes; default: the configured landing.")
    rounds: int = Field(1, ge=1, le=50, description="rollout -> verify -> train rounds.")
    tasks_per_round: int | None = Field(None, ge=1, description="Default: [cycle.rollout] tasks_per_round.")
    samples_per_task: int | None = Field(None, ge=2, le=64,
                                         description="G, the GRPO group size; default: [cycle.rollout.engine] n.")
    train_steps: int | None = Field(None, ge=1, le=10_000,
                                    description="GRPO optimiser steps per round; default: [cycle.train.grpo] steps.")
    eval_samples: int | None = Field(None, ge=1, le=64,
                                     description="Samples per evaluation item; default: [cycle.evaluate.engine] n.")
    max_staleness: int | None = Field(None, ge=0, le=8, description=(
        "Rounds a sampling policy may lag the one trained (0: synchronous); "
        "default: [cycle.rollout] max_staleness."))

    def overrides(self) -> dict[str, int]:
        """The [cycle] settings this run overrides, by path."""
        return {path: getattr(self, name) for name, path in OVERRIDES.items() if getattr(self, name) is not None}
