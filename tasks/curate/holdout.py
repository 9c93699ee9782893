"""Which kept tasks are held out of training, as the `fresh-failures` evaluation set.

The split is a pure function of the task id (itself a content hash), so it needs no
table, survives reruns, and agrees between curation, rollout and evaluation. A task's
position is the first 8 bytes of sha256("flywheel-holdout:" + task_id) read as a
number in [0, 1); it is held out when that number is below `fraction`. The position
never changes, so a task never moves sides between cycles, and raising the fraction
only moves tasks from training into the held-out set, never back.
"""
from __future__ import annotations

import hashlib

_SALT = b"flywheel-holdout:"  # keeps the split independent of other uses of the task id's bits


def holdout_position(task_id: str) -> float:
    """The task's fixed place in [0, 1)."""
    digest = hashlib.sha256(_SALT + task_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_heldout(task_id: str, fraction: float) -> bool:
    """True when the task belongs to the held-out (never trained on) side."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"the held-out fraction must be in [0, 1], got {fraction}")
    return holdout_position(task_id) < fraction
