"""`Verdict`: what every verifier returns for one (spec, completion) pair.

A verdict is data, not control flow: verifiers never raise into the pipeline, they
return a verdict whose `status` says what happened. `timeout` and `sandbox_error`
are infrastructure failures; the trainer keeps them out of advantages instead of
scoring them as wrong answers (docs/architecture.md, "Verifiers").
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal, get_args

Status = Literal["ok", "wrong", "format_error", "timeout", "sandbox_error", "hacking_suspected"]
STATUSES: tuple[str, ...] = get_args(Status)
INFRA_STATUSES = frozenset({"timeout", "sandbox_error"})
# The same, for SQL: `WHERE status NOT IN {INFRA_STATUSES_SQL}`.
INFRA_STATUSES_SQL = "(" + ", ".join(f"'{s}'" for s in sorted(INFRA_STATUSES)) + ")"

# The verdicts table stores `detail` per rollout; a runaway traceback or a 1 MB echo of
# the completion would bloat it, and a reader only needs the first lines.
DETAIL_MAX_CHARS = 500


@dataclass(frozen=True)
class Verdict:
    """One verifier's judgement.

    reward: final score in [0, 1] (what GRPO uses).
    passed: whether the completion is accepted as correct.
    components: named sub-scores in [0, 1], e.g. {"correctness": 1.0, "format": 1.0}.
    status: ok | wrong | format_error | timeout | sandbox_error | hacking_suspected.
    detail: short human-readable reason, truncated to DETAIL_MAX_CHARS.
    """

    reward: float
    passed: bool
    status: Status
    components: dict[str, float] = field(default_factory=dict)
    detail: str = ""

    def __post_init__(self) -> None:
        reward = float(self.reward)
        if math.isnan(reward) or not 0.0 <= reward <= 1.0:
            raise ValueError(f"Verdict.reward must be a float in [0, 1], got {self.reward!r}")
        object.__setattr__(self, "reward", reward)
        if self.status not in STATUSES:
            raise ValueError(f"Verdict.status must be one of {STATUSES}, got {self.status!r}")
        if not isinstance(self.passed, bool):
            raise ValueError(f"Verdict.passed must be a bool, got {self.passed!r}")
        if self.passed and self.status != "ok":
            raise ValueError(f"a passed verdict must have status 'ok', got {self.status!r}")
        components = {str(k): float(v) for k, v in self.components.items()}
        object.__setattr__(self, "components", components)
        object.__setattr__(self, "detail", truncate_detail(str(self.detail)))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        return cls(
            reward=data["reward"],
            passed=data["passed"],
            status=data["status"],
            components=dict(data.get("components") or {}),
            detail=data.get("detail", ""),
        )


def truncate_detail(text: str, limit: int = DETAIL_MAX_CHARS) -> str:
    if len(text) <= limit:
        return text
    suffix = f"... [{len(text)} chars, cut]"
    return text[: limit - len(suffix)] + suffix


def failed(status: Status, detail: str, **components: float) -> Verdict:
    """A verdict that did not pass: reward 0 with the given status and components."""
    return Verdict(reward=0.0, passed=False, status=status, components=components, detail=detail)
