"""The `evaluate` flow's parameters, in a module light enough for the webhook to import
(no torch, vLLM or GX): Prefect validates a run's parameters against this model."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class EvaluateParams(BaseModel):
    """Which model to evaluate against production, and what to do with the gate's answer."""

    model_config = ConfigDict(extra="forbid")
    policy_version: str | None = Field(
        None, min_length=1, max_length=200, description=(
            "The model to evaluate (a version or a prefix of 6+ characters); default: the newest candidate. "
            "The production model's version scores production alone (a baseline, no gate)."))
    evaluation_id: str | None = Field(
        None, min_length=1, max_length=200,
        description="Reuse to get a finished evaluation back instead of running it again; default: a new id.")
    eval_samples: int | None = Field(None, ge=1, le=64,
                                     description="Samples per evaluation item; default: [cycle.evaluate.engine] n.")
    apply_gate: bool = Field(False, description="Promote or reject the model as the gate decides, "
                                                "as a cycle would; default: only report.")

    def overrides(self) -> dict[str, int | bool]:
        """The [cycle] settings this run overrides, by path. Asked for by name, production
        is scored alone (a cycle that trained nothing skips it unless configured to)."""
        samples = {} if self.eval_samples is None else {"evaluate.engine.n": self.eval_samples}
        return {"evaluate.production_alone": True, **samples}
