"""A training job on disk: what the launcher's processes read and where they write.

```
JOB_DIR/job.json      base model, rollouts file, GRPOConfig, optional reference model
                      and SFT file
JOB_DIR/checkpoints/  the newest DeepSpeed checkpoint, tag step_<k>, which `latest` names
                      (each save deletes the one before: drop_superseded_checkpoints)
JOB_DIR/metrics.jsonl one row per optimiser step (train_steps columns less ids)
JOB_DIR/model/        the trained policy as a Hugging Face folder, written last
JOB_DIR/train.log     the launcher's and workers' output
```
A directory rather than arguments because it is also the unit of resumption: rerun
the same job and it continues from its newest checkpoint.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from trainer.grpo import GRPOConfig


STEP_TAG = re.compile(r"step_\d+")
"""The tag of the checkpoint saved after optimiser step k (trainer/ds_train.py)."""


class CheckpointError(RuntimeError):
    """A checkpoint that was asked for (or that `latest` names) is not there."""


@dataclass(frozen=True)
class TrainJob:
    base_model: str
    rollouts: str
    config: GRPOConfig = field(default_factory=GRPOConfig)
    ref_model: str | None = None      # frozen reference for the KL term (kl_coef > 0)
    sft_rows: str | None = None       # reference completions of unsolved tasks (trainer/sft.py)
    # auto: continue from the newest checkpoint if any; must: fail without one; never: start over
    resume: Literal["auto", "must", "never"] = "auto"
    # The job that trained base_model: this job starts from its final AdamW state (moments
    # and step count) instead of fresh moments, as one long run would. Fresh moments make
    # every round's first steps sign-like full-lr moves of every weight (bench/grpo_peer.py
    # --fresh-moments measures what that costs). Not carried where the state does not fit
    # (trainer/ds_train.py: carry_optimizer).
    optimizer_from: str | None = None

    def __post_init__(self) -> None:
        if self.resume not in ("auto", "must", "never"):
            raise ValueError(f"TrainJob.resume must be auto, must or never, got {self.resume!r}")
        if self.config.kl_coef > 0 and not self.ref_model:
            raise ValueError("TrainJob: GRPOConfig.kl_coef > 0 needs ref_model (e.g. the SFT model folder)")


def write_job(job_dir: str | Path, job: TrainJob) -> Path:
    job_dir = Path(job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "job.json").write_text(json.dumps(asdict(job), indent=2) + "\n")
    return job_dir


def read_job(job_dir: str | Path) -> TrainJob:
    path = Path(job_dir) / "job.json"
    if not path.exists():
        raise FileNotFoundError(f"no job.json in {job_dir}; write one with trainer.job.write_job")
    raw = json.loads(path.read_text())
    return TrainJob(**{**raw, "config": GRPOConfig(**raw["config"])})


def jobs_root(home: str | Path) -> Path:
    """Where the train stage keeps its jobs under FLYWHEEL_HOME, one folder per trained
    policy version (tasks/round/train.py)."""
    return Path(home) / "jobs"


def checkpoint_dir(job_dir: str | Path) -> Path:
    return Path(job_dir) / "checkpoints"


def metrics_path(job_dir: str | Path) -> Path:
    return Path(job_dir) / "metrics.jsonl"


def model_dir(job_dir: str | Path) -> Path:
    return Path(job_dir) / "model"


def read_metrics(job_dir: str | Path) -> list[dict]:
    path = metrics_path(job_dir)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def latest_tag(ckpt_dir: Path, required: bool) -> str | None:
    """The newest checkpoint tag in ckpt_dir, None if there is none and none is required."""
    latest = ckpt_dir / "latest"
    if not latest.exists():
        if required:
            raise CheckpointError(f"no DeepSpeed checkpoint in {ckpt_dir} (no 'latest' file) and the "
                                  "job says resume='must'; rerun with resume='auto' to start fresh")
        return None
    tag = latest.read_text().strip()
    if not (ckpt_dir / tag).is_dir():
        raise CheckpointError(f"{latest} names checkpoint {tag!r} but {ckpt_dir / tag} is missing; "
                              "delete 'latest' to restart from the base model")
    return tag


def drop_superseded_checkpoints(ckpt_dir: Path) -> list[str]:
    """Delete every checkpoint of ours (`step_<k>`) but the one `latest` names; returns the
    tags deleted. Nothing reads an older one: a resumed job and the next job's AdamW state
    both start from the newest, and each costs the weights and the optimiser state again
    (2.0 GiB for SmolLM2-135M under ZeRO-2: a 100-step job checkpointing every 4 steps
    kept 50 GiB). Called once every rank has saved (DeepSpeed's save ends in a barrier),
    so a kill at any moment leaves the newest complete checkpoint in place."""
    newest = latest_tag(ckpt_dir, required=False)
    if newest is None:
        return []
    old = sorted(p for p in ckpt_dir.iterdir() if p.is_dir() and p.name != newest and STEP_TAG.fullmatch(p.name))
    for path in old:
        shutil.rmtree(path)
    return [p.name for p in old]


def copy_tokenizer_files(src: Path, dst: Path) -> None:
    """Copy all but weights and model config (tokenizer, chat template) into a new folder."""
    for f in Path(src).iterdir():
        if f.is_file() and f.name != "config.json" and not f.name.startswith("model") \
                and not f.name.endswith((".safetensors", ".bin", ".pt")):
            shutil.copy2(f, Path(dst) / f.name)
