"""Adaptive sampling replayed on every round of a fixed-G demo, where tasks have history.

bench/routing.py measures a first round, where no task has history: the least favourable
case for adaptive sampling. This one replays the rounds of a `flywheel demo --no-routing`
lake. There every selected task got the whole group (G samples) in every round, so each
task-round's G outcomes are known, and any policy that samples a subset of them can be
replayed on them (samples are independent given the prompt and the policy that drew
them). Each policy sees, as a task's history, only what it sampled itself in the task's
last `--recent-rounds` rounds, and as its domain's what it sampled of the domain's tasks
in the domain's last rounds, as the rollout stage does.
  - fixed G: every task gets G; a group is kept when its rewards differ;
  - k/j/d: a first wave of `k` samples (`j` once a task's recent samples all agreed, or,
    with d > 0, while it has fewer than k of its own, its domain's, at least d of them),
    the rest of G only where `routing.needs_more` says the route is undecided; each
    triple is `RoutingConfig(first_samples=k, first_samples_after=j, domain_samples=d)`.
Measured as rollouts sampled per group kept; at an equal count of groups kept the saving
is 1 - policy / fixed. A bootstrap over tasks gives the interval. A smaller first wave
saves rollouts and also finds fewer groups with a rare pass, so both counts are shown.
Measured (2026-12-05, the tiny demo's 6 rounds, 6,144 task-rounds, 400 draws): fixed G
15.7 rollouts per kept group; 4/4/0 18.9% saved (17.7..20.2), 4/1/0 28.5% (26.7..30.3)
with 16% fewer groups kept, 4/1/32 (shipped) 30.2% (28.3..32.1) with the same groups as
4/1/0, 2/1/0 31.0% (29.2..33.1) with 30% fewer.

    .venv/bin/python bench/routing_rounds.py /tmp/fw-norouting [--recent-rounds 3]
"""

import argparse
import random
import sys
from collections import defaultdict
from dataclasses import replace
from itertools import groupby
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage.lake import open_lake  # noqa: E402
from storage.settings import LakeSettings  # noqa: E402
from tasks.round.rollout import CYCLE_STARTS_SQL  # noqa: E402
from tasks.round.routing import History, RoutingConfig, evidence, first_wave, needs_more  # noqa: E402
from verifiers.verdict import INFRA_STATUSES_SQL  # noqa: E402

# rounds in the order the rollout stage reads a task's history in
OUTCOMES_SQL = f"""
WITH started AS ({CYCLE_STARTS_SQL})
SELECT r.task_id, t.domain, r.cycle_id || '/' || r.round AS round_key, list(v.passed ORDER BY r.sample_idx) AS passed
FROM lake.rollouts r JOIN lake.verdicts v USING (rollout_id) JOIN lake.tasks t USING (task_id)
     LEFT JOIN started c ON c.cycle_id = r.cycle_id
WHERE v.status NOT IN {INFRA_STATUSES_SQL}
GROUP BY c.started_at, r.cycle_id, r.round, r.task_id, t.domain
ORDER BY c.started_at, r.cycle_id, r.round, r.task_id
"""
Round = tuple[str, str, str, list[bool]]  # task_id, domain, round key, pass/fail of each sample


def load_rounds(home: Path) -> list[Round]:
    """One row per task-round, oldest round first."""
    con = open_lake(LakeSettings(home=home), read_only=True)
    try:
        return [(task, domain, key, list(passed))
                for task, domain, key, passed in con.execute(OUTCOMES_SQL).fetchall()]
    finally:
        con.close()


def replay(rounds: list[Round], g: int, cfg: RoutingConfig | None, recent: int) -> tuple[int, int]:
    """(rollouts, groups kept) of one policy; cfg None is fixed G."""
    rollouts = kept = 0
    seen: dict[str, list[tuple[int, int]]] = defaultdict(list)  # task -> (samples, passes) per round
    domains: dict[str, list[tuple[int, int]]] = defaultdict(list)  # domain -> (samples, passes) per round
    for _, round_rows in groupby(rounds, key=lambda row: row[2]):
        tally: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
        for task, domain, _, outcomes in round_rows:
            group = outcomes[:g]
            if cfg is None:
                taken = group
            else:
                history = evidence(_history(seen[task][-recent:]), _history(domains[domain][-recent:]), cfg)
                head = group[:first_wave(history, cfg)]
                taken = group if needs_more(sum(head), len(head), history) else head
            rollouts += len(taken)
            kept += 0 < sum(taken) < len(taken)
            seen[task].append((len(taken), sum(taken)))
            tally[domain] = (tally[domain][0] + len(taken), tally[domain][1] + sum(taken))
        for domain, counts in tally.items():
            domains[domain].append(counts)
    return rollouts, kept


def _history(rounds: list[tuple[int, int]]) -> History:
    return History(sum(s for s, _ in rounds), sum(p for _, p in rounds))


def saving(rounds, g: int, cfg: RoutingConfig, recent: int) -> float:
    (fr, fk), (ar, ak) = replay(rounds, g, None, recent), replay(rounds, g, cfg, recent)
    return 1 - (ar / ak) / (fr / fk) if fk and ak else float("nan")


def bootstrap(rounds, g: int, cfg: RoutingConfig, recent: int, seed: int, reps: int) -> tuple[float, float]:
    """95% interval of the saving, resampling whole tasks: a task keeps its rounds in order,
    and a task drawn twice replays as two tasks, so their histories do not mix."""
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, (task, *_) in enumerate(rounds):
        by_task[task].append(i)
    tasks, rng, values = sorted(by_task), random.Random(seed), []
    for _ in range(reps):
        rows = sorted((i, f"{task}#{n}") for n, task in enumerate(rng.choice(tasks) for _ in tasks)
                      for i in by_task[task])
        values.append(saving([(label, *rounds[i][1:]) for i, label in rows], g, cfg, recent))
    values = sorted(v for v in values if v == v)
    return values[len(values) // 40], values[-len(values) // 40 - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("home", type=Path, help="FLYWHEEL_HOME of a `flywheel demo --no-routing` run")
    parser.add_argument("--group", type=int, default=8, help="G: the demo's samples per task")
    parser.add_argument("--recent-rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default="4/4/0,3/3/0,2/2/0,4/2/0,4/1/0,3/1/0,2/1/0,4/4/32,4/1/32,2/1/32",
                        help="first_samples/first_samples_after/domain_samples triples to replay")
    args = parser.parse_args()
    rounds = load_rounds(args.home)
    short = sum(len(o) < args.group for *_, o in rounds)
    print(f"{len(rounds)} task-rounds of {len({t for t, *_ in rounds})} tasks; {short} with fewer than "
          f"G = {args.group} judged samples (infrastructure failures)")
    fr, fk = replay(rounds, args.group, None, args.recent_rounds)
    print(f"{'first wave / after agreeing, by':<40} {'rollouts':>9} {'kept':>6} {'per kept':>9} {'saving':>7}"
          "  bootstrap 95%")
    print(f"{'fixed G':<40} {fr:>9} {fk:>6} {fr / fk:>9.1f}")
    shipped = RoutingConfig()
    for first, after, domain in ((int(k) for k in policy.split("/")) for policy in args.policies.split(",")):
        cfg = replace(shipped, first_samples=first, first_samples_after=after, domain_samples=domain)
        name = (f"{first}/{after}, " + (f"domain's from {domain}" if domain else "own history only")
                + (" (shipped)" if cfg == shipped else ""))
        ar, ak = replay(rounds, args.group, cfg, args.recent_rounds)
        low, high = bootstrap(rounds, args.group, cfg, args.recent_rounds, args.seed, args.reps)
        print(f"{name:<40} {ar:>9} {ak:>6} {ar / ak:>9.1f} {saving(rounds, args.group, cfg, args.recent_rounds):>7.1%}"
              f"  {low:.1%}..{high:.1%}")


if __name__ == "__main__":
    main()
