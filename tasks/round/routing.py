"""Routing by difficulty: where each task of a round goes, from what its samples showed.

GRPO learns only from a group whose rewards differ. A task no sample solves teaches it
nothing, and neither does one every sample solves; the failures users hit most are
often of the first kind. So each task of a round gets one route:
- `rl`     0 < passes < samples: the group has reward variance; GRPO trains on it;
- `sft`    no sample passed and the task has a reference solution: the solution, in
           the domain's answer format, is supervised data in the same training job;
- `skip`   not trained this round: every sample passed (solved, but not yet reliably),
           or none passed and there is no reference (a failure kept for later cycles);
- `retire` solved reliably: the lower end of its pass rate's interval, over this round
           and the recent ones, is at least `retire_above`; never selected again.

Sampling is adaptive: every task gets `first_samples` (`first_samples_after` once its
recent samples all agreed: a task failed or passed every time is re-checked with one
sample, not four; a task with few samples of its own goes by its domain's, so a new code
task costs one sample while the model has never yet passed a code task); a task whose
first wave is mixed is topped up to the full group (it is RL, and GRPO wants G samples),
and so is a task whose uniform first wave disagrees with its recent rounds (or its
domain's) or whose recent rounds were mixed (undecided: its route may still be RL). A
task uniform now and before, the same way, is decided after the first wave: the rest of
its group is never sampled. The pure core (`decide`) is what the tests hit; the rollout
stage (tasks/round/rollout.py) samples, scores and records the routes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist


@dataclass(frozen=True)
class RoutingConfig:
    adaptive: bool = True
    """False: every task gets the full group (engine.n) in one wave, as fixed-G GRPO does."""
    first_samples: int = 4
    """Samples per task in the first wave; the rest of engine.n only where undecided."""
    first_samples_after: int = 1
    """The first wave of a task whose recent samples (at least first_samples of them) all
    agreed: a hopeless or solved task costs this many a round until a sample disagrees.
    Replayed on a fixed-G demo's 6 rounds (bench/routing_rounds.py): 1 saves 28.5% of
    rollouts per kept group against fixed G, 4 (no history) 18.9%."""
    domain_samples: int = 32
    """A task with too little history of its own (fewer than first_samples samples) is
    sized by its domain's: when the domain's recent samples, at least this many, all
    agreed (a model that never yet wrote a passing program), its first wave is
    first_samples_after too. 0: a task's own history only. Replayed as above: 30.2%
    saved, the same groups kept as without it."""
    confidence: float = 0.95
    """Level of the pass rate's Wilson interval."""
    retire_above: float = 0.8
    """A solved task retires when its interval's lower end reaches this (~16 straight
    passes at 0.95); below it, a solved task is skipped and may come back."""
    sft: bool = True
    """False: unsolved tasks are skipped, as plain GRPO would drop them."""

    def __post_init__(self) -> None:
        if self.first_samples < 1 or self.first_samples_after < 1:
            raise ValueError("RoutingConfig.first_samples and first_samples_after must be >= 1")
        if self.domain_samples < 0:
            raise ValueError("RoutingConfig.domain_samples must be >= 0 (0: a task's own history only)")
        if not 0 < self.confidence < 1 or not 0 < self.retire_above <= 1:
            raise ValueError("RoutingConfig.confidence must be in (0, 1) and retire_above in (0, 1]")


@dataclass(frozen=True)
class History:
    """A task's scored samples in recent rounds (before this one)."""

    samples: int = 0
    passes: int = 0


@dataclass(frozen=True)
class Route:
    route: str
    reason: str


def wilson(passes: int, samples: int, confidence: float) -> tuple[float, float]:
    """The Wilson score interval of a pass rate (sound at 0 and n passes, unlike the normal one)."""
    if samples == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = passes / samples
    centre = (p + z * z / (2 * samples)) / (1 + z * z / samples)
    half = z * math.sqrt(p * (1 - p) / samples + z * z / (4 * samples * samples)) / (1 + z * z / samples)
    return max(0.0, centre - half), min(1.0, centre + half)


def agreed(history: History) -> bool:
    return history.passes in (0, history.samples)


def evidence(own: History, domain: History, cfg: RoutingConfig) -> History:
    """What a task's sampling this round is decided by: its own recent samples, or, while
    it has fewer than first_samples of them, its domain's when those all agreed. Only
    sampling: its route (retiring above all) rests on its own samples."""
    if own.samples >= cfg.first_samples or not cfg.domain_samples:
        return own
    return domain if domain.samples >= cfg.domain_samples and agreed(domain) else own


def first_wave(history: History, cfg: RoutingConfig) -> int:
    """Samples of a task's first wave: fewer once its recent samples all agreed."""
    if history.samples >= cfg.first_samples and agreed(history):
        return cfg.first_samples_after
    return cfg.first_samples


def needs_more(passes: int, samples: int, history: History) -> bool:
    """After the first wave: sample the rest of the group? Yes for a mixed group (RL wants
    the whole group), and for a uniform one whose recent rounds disagree with it or among
    themselves (undecided: its route may still be RL)."""
    return 0 < passes + history.passes < samples + history.samples


def decide(passes: int, samples: int, history: History, has_reference: bool, cfg: RoutingConfig) -> Route:
    """The route of a task whose samples this round (infra failures left out) passed
    `passes` of `samples` times."""
    if samples == 0:
        return Route("skip", "no sample was judged (infrastructure failures only)")
    if 0 < passes < samples:
        return Route("rl", f"{passes} of {samples} passed: the group has reward variance")
    if passes == 0:
        if not has_reference:
            return Route("skip", f"0 of {samples} passed and there is no reference solution: kept for later")
        if not cfg.sft:
            return Route("skip", f"0 of {samples} passed; the supervised route is off")
        return Route("sft", f"0 of {samples} passed: trained on its reference solution")
    low, _ = wilson(passes + history.passes, samples + history.samples, cfg.confidence)
    total = samples + history.samples
    if low >= cfg.retire_above:
        return Route("retire", f"{passes + history.passes} of {total} passed recently "
                               f"(lower bound {low:.2f} >= {cfg.retire_above}): solved")
    return Route("skip", f"{samples} of {samples} passed (lower bound {low:.2f} over {total} "
                         f"< {cfg.retire_above}): not yet retired")
