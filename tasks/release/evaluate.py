"""Evaluate a policy: G samples per evaluation item, scored by the verifiers, honestly.

What is evaluated: the latest version of every registered evaluation set, plus the
`fresh-failures` set: the kept tasks that `tasks.curate.holdout.is_heldout` keeps out of
training (of this cycle by default), i.e. the newest failures the model has never
trained on.

Contamination check, before anything counts: the tasks the policy was trained on are
those rolled out by any model of its lineage (itself and its ancestors through
`models.parent_version`; its own rollouts included on purpose, so the check is never
weaker than what the next round trains on). Each of those task prompts is probed
against the items with `tasks.curate.decontaminate` (exact, 13-gram overlap, MinHash). An
item that a training task copies is still generated and scored (its rows carry
`contaminated`) but left out of every headline number and listed with its evidence.
`decontaminate.find_contamination` reports one item per training prompt (its
strongest evidence), so a prompt copying two items flags only one of them.

Scoring: samples whose verdict is `timeout` or `sandbox_error` say nothing about the
model (docs/architecture.md, "Verifiers") and are left out of n; an item with no judged sample is unscored.
pass@1 and pass@k use the unbiased estimator (`tasks.release.passk`), per set and per domain.

Rows go to `evaluations`, one per item x sample, replacing any rows this
(policy_version, cycle_id) wrote before, in one commit. With `reuse = true` (off by
default: it makes the gate more conservative, see `tasks.release.reuse`), a registered
item this policy was already evaluated on under the same settings is not sampled again:
its rows are copied from that evaluation.
The generation engine is a parameter (`generate_each=`, same signature as
`trainer.engine.generate_each`).
Not here: the comparison of two policies (`tasks.release.gate`).
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from storage.lake import append_rows, transaction
from storage.schemas import SCHEMAS
from tasks.curate import decontaminate
from tasks.release import reuse
from tasks.release.gate import GateConfig, bootstrap_ci
from tasks.curate.holdout import is_heldout
from tasks.release.passk import item_scores, mean_pass_at_k
from tasks.round.scoring import FanOut, score_rows
from trainer import engine
from verifiers.registry import VerifierConfig
from storage.config_file import lake_settings
from tasks.release.models import local_model_dir

if TYPE_CHECKING:
    from tasks.stages import StageKey

FRESH_SET = "fresh-failures"
GenerateEach = Callable[..., list[list[engine.Sample]]]


@dataclass(frozen=True)
class EvalConfig:
    """engine: how to sample (engine.n is G, the samples per item).
    k: pass@k reported beside pass@1 (needs k <= G).
    heldout_fraction: share of kept tasks held out as `fresh-failures` (stable hash split).
    fresh_scope: "cycle" = held-out tasks created by this cycle, "all" = of every cycle.
    decontam: how an eval item is matched against training tasks.
    verifiers / fanout / scheduler_address: how verification runs (tasks.round.scoring.score_rows).
    resamples / confidence / seed: the bootstrap interval of the headline pass@1.
    reuse: take a registered item's rows from this policy's earlier evaluation under the
        same settings instead of sampling it again (tasks.release.reuse): about half the
        sampling of an evaluation, for a more conservative gate; off by default.
    production_alone: when there is no candidate (the policy is production itself: a
        cycle that trained nothing, or `flywheel evaluate PRODUCTION`), score production
        alone, a baseline with nothing for the gate to compare; off in cycles by default
        (their evaluation is then skipped), on in the on-demand flow.
    """

    engine: engine.EngineConfig = field(default_factory=lambda: engine.EngineConfig(n=8, max_tokens=32))
    k: int = 4
    heldout_fraction: float = 0.1
    fresh_scope: str = "cycle"
    decontam: decontaminate.DecontamConfig = field(default_factory=decontaminate.DecontamConfig)
    verifiers: VerifierConfig = field(default_factory=VerifierConfig)
    fanout: FanOut = field(default_factory=FanOut)
    scheduler_address: str | None = None
    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0
    reuse: bool = False
    production_alone: bool = False

    def __post_init__(self) -> None:
        for name in ("reuse", "production_alone"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not 1 <= self.k <= self.engine.n:
            raise ValueError(f"k must be in [1, engine.n={self.engine.n}] (pass@k needs k samples), got {self.k}")
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in [0, 1), e.g. 0.1, got {self.heldout_fraction}")
        if self.fresh_scope not in ("cycle", "all"):
            raise ValueError(f"fresh_scope must be 'cycle' or 'all', got {self.fresh_scope!r}")
        GateConfig(resamples=self.resamples, confidence=self.confidence)  # same bounds as the gate's


@dataclass(frozen=True)
class Item:
    eval_set: str
    eval_version: str | None
    item_id: str
    domain: str | None
    prompt: str
    messages: list[dict]
    verifier: str | None
    spec: dict


@dataclass(frozen=True)
class EvalSummary:
    """What one evaluation found; small enough to return from a Prefect task.

    headline: items, unscored, pass@1, its interval (low, high), pass@k, over clean items.
    sets / domains: the same per evaluation set and per domain.
    process: tokens per answer, truncation / format-error / timeout / sandbox-error rates.
    item_scores: per clean item its pass rate (`score`), n judged and c passed: the gate's input.
    contaminated: excluded items with the training task that copies them and the evidence.
    reused: items whose rows came from an earlier evaluation (tasks.release.reuse).
    left_out: items not sampled, by reason (trainer.engine.prompt_problems: too_long, the
        policy's chat template refuses them: unrenderable); in no number above.
    """

    policy_version: str
    cycle_id: str
    samples: int
    k: int
    headline: dict
    sets: dict
    domains: dict
    process: dict
    item_scores: list[dict]
    contaminated: list[dict]
    reused: int = 0
    left_out: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def registered_items(con: duckdb.DuckDBPyConnection) -> list[Item]:
    """Items of the newest version of every registered set (newest as `tasks.curate.evalsets` says)."""
    rows = con.execute("""
        WITH versions AS (
            SELECT eval_set, eval_version FROM lake.eval_items GROUP BY eval_set, eval_version
            QUALIFY row_number() OVER (PARTITION BY eval_set ORDER BY min(added_at) DESC, eval_version) = 1)
        SELECT e.eval_set, e.eval_version, e.item_id, e.domain, e.prompt, e.messages, e.verifier, e.reference
        FROM lake.eval_items e JOIN versions USING (eval_set, eval_version)
        WHERE e.eval_set <> ? ORDER BY e.eval_set, e.item_id""", [FRESH_SET]).fetchall()
    return [Item(s, v, i, d, p, json.loads(m), vf, json.loads(r)) for s, v, i, d, p, m, vf, r in rows]


def fresh_items(con: duckdb.DuckDBPyConnection, cfg: EvalConfig, cycle_id: str) -> list[Item]:
    """The held-out kept tasks, as the `fresh-failures` set."""
    where = "WHERE cycle_id = ?" if cfg.fresh_scope == "cycle" else "WHERE ? IS NOT NULL"
    rows = con.execute(f"SELECT task_id, domain, prompt, messages, verifier, spec FROM lake.tasks {where} "
                       "ORDER BY task_id", [cycle_id]).fetchall()
    return [Item(FRESH_SET, None, t, d, p, json.loads(m), v, json.loads(s))
            for t, d, p, m, v, s in rows if is_heldout(t, cfg.heldout_fraction)]


def lineage(con: duckdb.DuckDBPyConnection, policy_version: str) -> list[str]:
    """The version and its ancestors, nearest first."""
    chain, version = [], policy_version
    while version is not None and version not in chain:
        chain.append(version)
        row = con.execute("SELECT parent_version FROM lake.models WHERE policy_version = ? "
                          "ORDER BY created_at LIMIT 1", [version]).fetchone()
        version = row[0] if row else None
    return chain


def training_tasks(con: duckdb.DuckDBPyConnection, *versions: str) -> list[tuple[str, str]]:
    """(task_id, prompt) of every task rolled out by the lineage of any of `versions`."""
    chain = sorted({v for version in versions for v in lineage(con, version)})
    return [tuple(r) for r in con.execute("""
        SELECT task_id, prompt FROM lake.tasks
        WHERE task_id IN (SELECT task_id FROM lake.rollouts WHERE list_contains(?, policy_version))
        QUALIFY row_number() OVER (PARTITION BY task_id ORDER BY created_at) = 1
        ORDER BY task_id""", [chain]).fetchall()]


def find_contaminated(items: list[Item], train: list[tuple[str, str]],
                      cfg: decontaminate.DecontamConfig) -> dict[tuple[str, str], list[dict]]:
    """(eval_set, item_id) -> the training tasks that copy it, with evidence."""
    if not items or not train:
        return {}
    index = decontaminate.build_eval_index(
        [decontaminate.EvalItem(i.eval_set, i.item_id, i.prompt) for i in items], cfg)
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for hit in decontaminate.find_contamination([prompt for _, prompt in train], index, cfg):
        key = (hit.evidence["eval_set"], hit.evidence["item_id"])
        out[key].append({"task_id": train[hit.record][0], "evidence": hit.evidence})
    return dict(out)


def score_samples(items: list[Item], samples: list[engine.Sample], cfg: EvalConfig) -> list[dict]:
    """One verdict dict per sample, in sample order (routed by tasks.round.scoring.score_rows)."""
    rows = [{"id": k, "verifier": items[s.prompt_idx].verifier, "domain": items[s.prompt_idx].domain,
             "spec": items[s.prompt_idx].spec, "prompt": items[s.prompt_idx].prompt, "completion": s.text}
            for k, s in enumerate(samples)]
    return score_rows(rows, cfg.verifiers, cfg.fanout, scheduler_address=cfg.scheduler_address)


def evaluation_rows(items: list[Item], samples: list[engine.Sample], verdicts: list[dict],
                    contaminated: set[tuple[str, str]], policy_version: str, cycle_id: str,
                    settings: str) -> list[dict]:
    out = []
    for sample, verdict in zip(samples, verdicts, strict=True):
        item = items[sample.prompt_idx]
        out.append({"policy_version": policy_version, "eval_set": item.eval_set, "item_id": item.item_id,
                    "eval_version": item.eval_version, "domain": item.domain, "sample_idx": sample.sample_idx,
                    "reward": float(verdict["reward"]), "passed": bool(verdict["passed"]),
                    "status": verdict["status"], "completion_tokens": len(sample.token_ids),
                    "finish_reason": sample.finish_reason,
                    "contaminated": (item.eval_set, item.item_id) in contaminated, "cycle_id": cycle_id,
                    "settings": settings, "reused_from": None})
    return out


def write_evaluations(con: duckdb.DuckDBPyConnection, rows: list[dict], policy_version: str,
                      cycle_id: str) -> None:
    """Replace this (policy, cycle)'s rows in one commit, so a rerun leaves no duplicates."""
    table = pa.Table.from_pylist(rows, schema=SCHEMAS["evaluations"])
    with transaction(con, f"evaluate {policy_version[:12]} in {cycle_id}: {len(rows)} samples"):
        con.execute("DELETE FROM lake.evaluations WHERE policy_version = ? AND cycle_id = ?",
                    [policy_version, cycle_id])
        append_rows(con, "evaluations", table)


def _rates(scores: list[dict], k: int, ci: GateConfig | None = None) -> dict:
    judged = [s for s in scores if s["n"] > 0]
    n, c = np.array([s["n"] for s in judged]), np.array([s["c"] for s in judged])
    with_k = n >= k
    out = {"items": len(judged), "unscored": len(scores) - len(judged),
           "pass@1": mean_pass_at_k(n, c, 1), f"pass@{k}": mean_pass_at_k(n[with_k], c[with_k], k)}
    if ci is not None:
        out["low"], out["high"] = bootstrap_ci([s["score"] for s in judged], ci)
    return out


def process_metrics(rows: list[dict]) -> dict:
    """How the answers looked, over every sample of the headline items."""
    total = len(rows)
    if total == 0:
        return {"samples": 0}
    statuses = [r["status"] for r in rows]
    return {"samples": total,
            "tokens_per_answer": sum(r["completion_tokens"] for r in rows) / total,
            "truncation_rate": sum(r["finish_reason"] == "length" for r in rows) / total,
            "format_error_rate": statuses.count("format_error") / total,
            "timeout_rate": statuses.count("timeout") / total,
            "sandbox_error_rate": statuses.count("sandbox_error") / total}


def summarize(rows: list[dict], contaminated: dict[tuple[str, str], list[dict]], cfg: EvalConfig,
              policy_version: str, cycle_id: str) -> EvalSummary:
    clean = [r for r in rows if not r["contaminated"]]
    scores = item_scores(pl.DataFrame(clean, infer_schema_length=None)) if clean else []
    ci = GateConfig(resamples=cfg.resamples, confidence=cfg.confidence, seed=cfg.seed)
    by_set, by_domain = defaultdict(list), defaultdict(list)
    for s in scores:
        by_set[s["eval_set"]].append(s)
        by_domain[s["domain"] or "unknown"].append(s)
    excluded = [{"eval_set": key[0], "item_id": key[1], **hit} for key, hits in sorted(contaminated.items())
                for hit in hits]
    return EvalSummary(
        policy_version, cycle_id, cfg.engine.n, cfg.k, headline=_rates(scores, cfg.k, ci),
        sets={name: _rates(group, cfg.k) for name, group in sorted(by_set.items())},
        domains={name: _rates(group, cfg.k) for name, group in sorted(by_domain.items())},
        process=process_metrics(clean), item_scores=[s for s in scores if s["n"] > 0], contaminated=excluded)


@dataclass(frozen=True)
class Policy:
    """A model to evaluate. also_check: other versions whose training tasks also make an
    item contaminated (production is evaluated with the candidate's, so that both
    headlines stand on the same clean items; the gate pairs items either way)."""

    model_dir: str
    version: str
    also_check: tuple[str, ...] = ()


@dataclass(frozen=True)
class EvalPlan:
    """One policy's evaluation before sampling: the items it can be asked (they render and
    fit its context), the rows reused for some of them, the rest to sample, the contaminated
    items, and how many items it cannot be asked, by reason."""

    policy: Policy
    items: list[Item]
    reused: dict[tuple[str, str], list[dict]]
    to_sample: list[Item]
    contaminated: dict[tuple[str, str], list[dict]]
    left_out: dict[str, int] = field(default_factory=dict)


def plan_policy(con: duckdb.DuckDBPyConnection, policy: Policy, items: list[Item], cfg: EvalConfig,
                settings: str, cycle_id: str, measure_fit: bool) -> EvalPlan:
    mine, left_out = items, Counter()
    if items and measure_fit:  # longer than the model's context, or refused by its template: unscorable
        problems = engine.prompt_problems(policy.model_dir, [i.messages for i in items], cfg.engine,
                                          [i.domain for i in items])
        mine = [item for item, problem in zip(items, problems, strict=True) if problem is None]
        left_out = Counter(p for p in problems if p is not None)
    reused = reuse.earlier_rows(con, policy.version, mine, settings, cfg.engine.n, cycle_id) if cfg.reuse else {}
    train = training_tasks(con, policy.version, *policy.also_check)
    return EvalPlan(policy, mine, reused, [i for i in mine if (i.eval_set, i.item_id) not in reused],
                 find_contaminated(mine, train, cfg.decontam), dict(left_out))


def reused_rows(plan: EvalPlan, cycle_id: str) -> list[dict]:
    """The plan's reused rows as this cycle's, with this cycle's contamination check."""
    return [{**row, "cycle_id": cycle_id, "contaminated": key in plan.contaminated}
            for key, rows in plan.reused.items() for row in rows]


def evaluate_policies(con: duckdb.DuckDBPyConnection, policies: list[Policy], cfg: EvalConfig, cycle_id: str,
                      *, generate_each: GenerateEach = engine.generate_each) -> list[EvalSummary]:
    """Sample, check contamination, score, write `evaluations`; one summary per policy.

    All policies are sampled in one engine call: vLLM then starts and warms up once
    for candidate and production instead of once each.
    """
    items = registered_items(con) + fresh_items(con, cfg, cycle_id)
    settings = reuse.settings_key(cfg.engine, cfg.verifiers)
    plans = [plan_policy(con, policy, items, cfg, settings, cycle_id, generate_each is engine.generate_each)
             for policy in policies]
    sampled = [plan for plan in plans if plan.to_sample]
    generated = generate_each([(plan.policy.model_dir, [i.messages for i in plan.to_sample]) for plan in sampled],
                              cfg.engine, [[i.domain for i in plan.to_sample] for plan in sampled]) if sampled else []
    if len(generated) != len(sampled):
        raise RuntimeError(f"the engine answered {len(generated)} of {len(sampled)} models")
    outputs = iter(generated)
    summaries = []
    for plan in plans:
        version = plan.policy.version
        rows = reused_rows(plan, cycle_id)
        if plan.to_sample:
            samples = next(outputs)
            if len(samples) != len(plan.to_sample) * cfg.engine.n:
                raise RuntimeError(f"the engine returned {len(samples)} samples for {len(plan.to_sample)} items "
                                   f"x {cfg.engine.n}; expected one per item and sample")
            verdicts = score_samples(plan.to_sample, samples, cfg)
            rows += evaluation_rows(plan.to_sample, samples, verdicts, set(plan.contaminated), version, cycle_id,
                                    settings)
        order = {(i.eval_set, i.item_id): k for k, i in enumerate(plan.items)}
        rows.sort(key=lambda r: (order[(r["eval_set"], r["item_id"])], r["sample_idx"]))
        write_evaluations(con, rows, version, cycle_id)
        summaries.append(replace(summarize(rows, plan.contaminated, cfg, version, cycle_id),
                                 reused=len(plan.reused), left_out=plan.left_out))
    return summaries


def run(con: duckdb.DuckDBPyConnection, cfg: EvalConfig, key: StageKey) -> dict:
    """The evaluate stage: the key's candidate (`policy`) and `production` on every
    evaluation set; production is checked for contamination by the candidate's training
    tasks too, so both headlines stand on the same clean items."""
    if key.policy == key.production:
        return evaluate_production_alone(con, cfg, key) if cfg.production_alone else {"evaluated": False}
    settings = lake_settings()
    cand, prod = evaluate_policies(con, [
        Policy(str(local_model_dir(settings, con, key.policy)), key.policy),
        Policy(str(local_model_dir(settings, con, key.production)), key.production, also_check=(key.policy,))],
        cfg, key.cycle_id)
    return {"evaluated": True, "candidate": cand.headline, "production": prod.headline,
            "contaminated": len(cand.contaminated), "reused_items": cand.reused + prod.reused,
            "left_out": {"candidate": cand.left_out, "production": prod.left_out}}


def evaluate_production_alone(con: duckdb.DuckDBPyConnection, cfg: EvalConfig, key: StageKey) -> dict:
    """Production on every evaluation set with no candidate beside it (EvalConfig.production_alone),
    checked for contamination by its own lineage's training tasks."""
    (prod,) = evaluate_policies(con, [Policy(str(local_model_dir(lake_settings(), con, key.production)),
                                             key.production)], cfg, key.cycle_id)
    return {"evaluated": True, "production": prod.headline, "contaminated": len(prod.contaminated),
            "reused_items": prod.reused, "left_out": {"production": prod.left_out}}
