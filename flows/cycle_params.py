"""The cycle's parameters, in a module light enough for the webhook to import
(no torch, vLLM or GX): Prefect validates a run's parameters against this model."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CycleParams(BaseModel):
    """What one cycle does; validated when a run is created (UI, webhook, CLI)."""

    model_config = ConfigDict(extra="forbid")
    cycle_id: str | None = Field(None, description="Reuse to resume a failed cycle; default: a new id.")
    landing: list[str] = Field(default_factory=list,
                               description="Files, folders or s3:// prefixes; default: the configured landing.")
    rounds: int = Field(1, ge=1, le=50, description="rollout -> verify -> train rounds.")
    tasks_per_round: int = Field(64, ge=1)
    samples_per_task: int = Field(8, ge=2, le=64, description="G, the GRPO group size.")
    train_steps: int | None = Field(None, ge=1, le=10_000,
                                    description="GRPO optimiser steps per round; default: [cycle.train.grpo] steps.")
    eval_samples: int = Field(8, ge=1, le=64)
