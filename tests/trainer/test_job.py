import pytest

from trainer.grpo import GRPOConfig
from trainer.job import TrainJob, drop_superseded_checkpoints, read_job, write_job


def test_job_round_trips_through_its_directory(tmp_path):
    job = TrainJob("base", "r.parquet", GRPOConfig(steps=3, loss_agg="dr_grpo"), resume="never")
    assert read_job(write_job(tmp_path / "j", job)) == job


def test_job_validation():
    with pytest.raises(ValueError, match="kl_coef > 0 needs ref_model"):
        TrainJob("base", "r.parquet", GRPOConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="resume must be auto, must or never"):
        TrainJob("base", "r.parquet", resume="maybe")


def test_missing_job_file_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="write_job"):
        read_job(tmp_path)


def test_only_the_checkpoint_latest_names_survives_a_save(tmp_path):
    ckpt = tmp_path / "checkpoints"
    for tag in ("step_4", "step_8", "step_12", "my-notes"):
        (ckpt / tag).mkdir(parents=True)
        (ckpt / tag / "mp_rank_00_model_states.pt").write_bytes(b"x")
    assert drop_superseded_checkpoints(ckpt) == []  # no `latest`: nothing is known to be complete
    (ckpt / "latest").write_text("step_8")  # a kill during step_12's save left it partial
    assert drop_superseded_checkpoints(ckpt) == ["step_12", "step_4"]
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "my-notes", "step_8"]
