"""Train stage: scored rollouts of one round -> DeepSpeed GRPO job -> candidate model.

The same job learns the round's `sft` tasks (no sample solved them) from their
reference solutions (trainer/sft.py), written in the domain's answer format.

Exports the round's rollouts joined with their verdicts to a Parquet snapshot (the
trainer never reads the lake), runs the job (trainer.launch: one DeepSpeed process
per device, through the `deepspeed` launcher when there are several), then writes
the job's per-step metrics to `train_steps` and the new policy to `models` (status
`candidate`, with its parent) in one DuckLake commit. The
policy version is a content hash of (parent, round, rollout ids, config), so a rerun
of the same round resumes the same job directory and writes nothing twice.
`run` (the stage) then stores the folder in the bucket when the lake is on S3, so any
worker can load it; `train_policy` alone leaves `uri` the local folder.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from storage.config_file import lake_settings
from storage.lake import append_rows, transaction
from storage.lake_turn import lake_released
from storage.schemas import SCHEMAS
from trainer.grpo import GRPOConfig
from trainer.job import TrainJob, jobs_root, read_metrics, write_job
from tasks.release.models import local_model_dir, publish_model
from tasks.round.adaptive import template_args
from trainer.launch import run_training
from trainer.model_facts import read_facts
from trainer.rollout_data import group_rollouts, read_rollouts
from trainer.sft import encode_sft
from verifiers.registry import VERIFIERS

if TYPE_CHECKING:
    from tasks.stages import StageKey


class NothingToLearn(Exception):
    """Every group of the round has one reward for all its samples (all pass or all fail),
    so GRPO's advantages are all zero, and no unsolved task has a usable reference for
    the supervised part. With a real model that is common, not an error."""

    def __init__(self, groups_dropped: int) -> None:
        super().__init__(f"all {groups_dropped} groups have zero reward variance and no task is routed to "
                         "SFT with a usable reference: nothing to learn from")
        self.groups_dropped = groups_dropped


@dataclass(frozen=True)
class TrainStageConfig:
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    n_procs: int = 1             # DeepSpeed processes (1-2 on CPU, one per GPU on a GPU worker)
    device: str = "auto"         # auto | cpu
    timeout_s: float = 3600.0
    sft_formats: Mapping[str, str] = field(default_factory=dict)
    """domain -> the answer format an SFT completion is written in, filled from the
    task's reference (`"{answer}"`: a bare number, the way the tiny demo model answers);
    a domain not named here uses its verifier's gold completion (math: a sentence ending
    in \\boxed{answer}; code: a fenced program; json: the object)."""
    carry_moments: bool = True
    """A round's job starts from the AdamW state of the job that trained its parent (in
    this home's jobs/), as one long run would; false: fresh moments each job
    (bench/grpo_peer.py --fresh-moments measures the two; README). The job starts fresh,
    and says so in its log, where the state does not fit: a parent imported rather than
    trained here, another ZeRO stage or (under ZeRO) rank count, or LoRA on either side."""

    warm_launch: bool = True
    """A CPU job (each of its ranks) is forked from a launcher that has imported torch,
    DeepSpeed and transformers once for the process (trainer/warm_launch.py: ~8 s less a
    job on 2 cores, the same weights); false: every job starts cold interpreters."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sft_formats", dict(self.sft_formats))
        if self.n_procs < 1:
            raise ValueError("TrainStageConfig.n_procs must be >= 1")
        if self.device not in ("auto", "cpu"):
            raise ValueError("TrainStageConfig.device must be 'auto' or 'cpu'")


EXPORT_SQL = """
SELECT r.rollout_id, r.task_id, r.sample_idx, r.prompt_token_ids, r.token_ids, r.logprobs,
       v.reward, v.status
FROM lake.rollouts r JOIN lake.verdicts v USING (rollout_id)
WHERE r.policy_version = ? AND r.round = ? AND r.cycle_id = ?
ORDER BY r.task_id, r.sample_idx
"""


def export_rollouts(con: duckdb.DuckDBPyConnection, policy_version: str, round_idx: int, path: Path,
                    cycle_id: str) -> pa.Table:
    table = con.execute(EXPORT_SQL, [policy_version, round_idx, cycle_id]).to_arrow_table()
    if table.num_rows == 0:
        raise ValueError(f"no scored rollouts for policy {policy_version} round {round_idx}; "
                         "run the rollout and verify stages first")
    pq.write_table(table, path)
    return table


SFT_SQL = """
SELECT x.task_id, t.domain, t.messages, t.verifier, t.spec, t.chat_template_kwargs
FROM lake.routes x JOIN lake.tasks t USING (task_id)
WHERE x.policy_version = ? AND x.round = ? AND x.cycle_id = ? AND x.route = 'sft'
ORDER BY x.task_id
"""


def sft_completion(task: dict, cfg: TrainStageConfig) -> str | None:
    """The reference completion of an `sft` task in its domain's answer format; None when
    the task's reference does not fill it."""
    spec = json.loads(task["spec"])
    fmt = cfg.sft_formats.get(task["domain"])
    if fmt is None:
        return VERIFIERS[task["verifier"]].gold_completion(spec)
    try:
        return fmt.format(**spec)
    except (KeyError, IndexError, ValueError):
        return None


def export_sft(con: duckdb.DuckDBPyConnection, base_model: str | Path, policy_version: str, round_idx: int,
               path: Path, cycle_id: str, cfg: TrainStageConfig) -> dict:
    """The round's `sft` tasks as an SFT file (trainer/sft.py) at `path`; counts of rows
    written and of tasks left out (no usable reference, or too long for the context)."""
    cols = ["task_id", "domain", "messages", "verifier", "spec", "chat_template_kwargs"]
    tasks = [dict(zip(cols, r)) for r in con.execute(SFT_SQL, [policy_version, round_idx, cycle_id]).fetchall()]
    texts = [sft_completion(t, cfg) for t in tasks]
    usable = [(t, c) for t, c in zip(tasks, texts, strict=True) if c]
    rows = encode_sft(base_model, [json.loads(t["messages"]) for t, _ in usable], [c for _, c in usable],
                      [template_args(t) for t, _ in usable]) if usable else []
    context = read_facts(base_model).context_length
    kept = [{"task_id": t["task_id"], **r} for (t, _), r in zip(usable, rows, strict=True)
            if len(r["prompt_token_ids"]) + len(r["token_ids"]) <= context]
    if kept:
        pq.write_table(pa.Table.from_pylist(kept), path)
    return {"sft_rows": len(kept), "sft_no_reference": len(tasks) - len(usable),
            "sft_too_long": len(usable) - len(kept)}


def new_policy_version(parent: str, round_idx: int, rollout_ids: list[str], cfg: TrainStageConfig,
                       sft_task_ids: list[str] = ()) -> str:
    key = json.dumps([parent, round_idx, sorted(rollout_ids), asdict(cfg.grpo)]
                     + ([sorted(sft_task_ids), cfg.sft_formats] if sft_task_ids else []), sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()


def train_step_rows(metrics: list[dict], policy_version: str, cycle_id: str) -> pa.Table:
    names = [f.name for f in SCHEMAS["train_steps"]]
    rows = [{**{k: m.get(k) for k in names}, "policy_version": policy_version, "cycle_id": cycle_id}
            for m in metrics]
    return pa.Table.from_pylist(rows, schema=SCHEMAS["train_steps"])


def model_row(policy_version: str, parent: str, uri: str, cycle_id: str, behaviour: str | None = None) -> pa.Table:
    reason = "trained by GRPO" if behaviour in (None, parent) else f"trained by GRPO on rollouts of {behaviour[:12]}"
    return pa.Table.from_pylist([{
        "policy_version": policy_version, "parent_version": parent, "uri": uri, "status": "candidate",
        "reason": reason, "created_at": datetime.now(timezone.utc), "cycle_id": cycle_id}],
        schema=SCHEMAS["models"])


def train_policy(con: duckdb.DuckDBPyConnection, base_model: str | Path, parent_version: str, round_idx: int,
                 jobs_root: str | Path, cycle_id: str, cfg: TrainStageConfig = TrainStageConfig()) -> str:
    """Train on the round's rollouts (GRPO) and its `sft` tasks' references; returns the
    new candidate's policy_version. Raises NothingToLearn, before any job starts, when no
    group has reward variance and no task has a usable reference."""
    return train_round(con, base_model, parent_version, round_idx, jobs_root, cycle_id, cfg)["policy_version"]


def train_round(con: duckdb.DuckDBPyConnection, base_model: str | Path, parent_version: str, round_idx: int,
                jobs_root: str | Path, cycle_id: str, cfg: TrainStageConfig, behaviour: str | None = None) -> dict:
    """`train_policy` with the SFT counts. `behaviour`: the policy that sampled the round,
    when older than the parent trained from (an overlapped cycle); the trainer weighs
    each token by min(pi_parent / pi_behaviour, tis_cap) against the sampled logprobs."""
    sampled_by = behaviour or parent_version
    staging = Path(jobs_root) / f"export-{parent_version[:16]}-{round_idx}.parquet"
    staging_sft = staging.with_suffix(".sft.parquet")
    staging.parent.mkdir(parents=True, exist_ok=True)
    exported = export_rollouts(con, sampled_by, round_idx, staging, cycle_id)
    sft = export_sft(con, base_model, sampled_by, round_idx, staging_sft, cycle_id, cfg)
    groups = group_rollouts(read_rollouts(staging), cfg.grpo.scale_by_std, cfg.grpo.dynamic_sampling)
    if groups.with_signal == 0 and not sft["sft_rows"]:
        staging.unlink()
        raise NothingToLearn(groups.groups_kept + groups.groups_dropped)
    sft_ids = pq.read_table(staging_sft)["task_id"].to_pylist() if sft["sft_rows"] else []
    version = new_policy_version(parent_version, round_idx, exported["rollout_id"].to_pylist(), cfg, sft_ids)
    known = con.execute("SELECT count(*) FROM lake.models WHERE policy_version = ?", [version]).fetchone()[0]
    if known:
        return {"policy_version": version, "sampled_by": sampled_by, **sft}
    job_dir = Path(jobs_root) / version
    rollouts, sft_rows = job_dir / "rollouts.parquet", job_dir / "sft.parquet"
    job_dir.mkdir(parents=True, exist_ok=True)
    staging.replace(rollouts)
    if sft["sft_rows"]:
        staging_sft.replace(sft_rows)
    # kl_coef > 0: the KL is to the round's starting policy (the candidate's parent), frozen
    parent_job = Path(jobs_root) / parent_version  # absent for a model that was imported, not trained here
    write_job(job_dir, TrainJob(base_model=str(base_model), rollouts=str(rollouts), config=cfg.grpo,
                                ref_model=str(base_model) if cfg.grpo.kl_coef > 0 else None,
                                sft_rows=str(sft_rows) if sft["sft_rows"] else None,
                                optimizer_from=str(parent_job) if cfg.carry_moments else None))
    # the job's minutes leave the lake to the stage an overlapped cycle samples meanwhile;
    # a job that dies exports nothing (trainer/ds_train.py renames a finished folder into
    # place) and no `models` row names it
    with lake_released(con):
        trained = run_training(job_dir, cfg.n_procs, cfg.device, cfg.timeout_s, cfg.warm_launch)
    with transaction(con, f"train {version[:12]} from {parent_version[:12]}"):
        append_rows(con, "train_steps", train_step_rows(read_metrics(job_dir), version, cycle_id))
        append_rows(con, "models", model_row(version, parent_version, str(trained), cycle_id, sampled_by))
    return {"policy_version": version, "sampled_by": sampled_by, **sft}


def run(con: duckdb.DuckDBPyConnection, cfg: TrainStageConfig, key: StageKey) -> dict:
    """The train stage: GRPO on the round's scored rollouts (sampled by `key.behaviour`
    when the cycle overlaps), from `key.policy`. Its `policy_version` is the
    new candidate, or the key's policy unchanged when no rollout of the round was scored
    or no group has anything to learn (recorded in the counts; the cycle goes on)."""
    scored = con.execute("SELECT count(*) FROM lake.rollouts r JOIN lake.verdicts v USING (rollout_id) "
                         "WHERE r.cycle_id = ? AND r.round = ?", [key.cycle_id, key.round]).fetchone()[0]
    if scored == 0:
        return {"policy_version": key.policy, "trained": False}
    settings = lake_settings()
    base = local_model_dir(settings, con, key.policy)
    try:
        trained = train_round(con, base, key.policy, key.round, jobs_root(settings.home), key.cycle_id, cfg,
                              key.behaviour or None)
    except NothingToLearn as nothing:
        return {"policy_version": key.policy, "trained": False, "groups_kept": 0,
                "groups_dropped": nothing.groups_dropped, "reason": str(nothing)}
    version = trained.pop("policy_version")
    if settings.uses_s3:
        folder = local_model_dir(settings, con, version)
        with lake_released(con):  # an upload of minutes for a real model
            uri = publish_model(settings, folder, version)
        with transaction(con, message=f"model {version[:12]} stored at {uri}"):
            con.execute("UPDATE lake.models SET uri = ? WHERE policy_version = ?", [uri, version])
    # every step row carries the job's group counts
    steps = con.execute("SELECT count(*), max(groups_kept), max(groups_dropped) FROM lake.train_steps "
                        "WHERE policy_version = ?", [version]).fetchone()
    return {"policy_version": version, "trained": True, "steps": steps[0],
            "groups_kept": int(steps[1] or 0), "groups_dropped": int(steps[2] or 0), **trained}
