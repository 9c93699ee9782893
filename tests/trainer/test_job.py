import pytest

from trainer.grpo import GRPOConfig
from trainer.job import TrainJob, read_job, write_job


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
