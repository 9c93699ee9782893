"""LoRA (PEFT) GRPO jobs: adapters train, and the candidate is merged into a plain folder."""
import pytest
import torch
from safetensors.torch import load_file

from trainer.grpo import GRPOConfig
from trainer.job import TrainJob, read_metrics, write_job
from trainer.launch import start_training, wait_training

pytestmark = pytest.mark.slow


def test_a_lora_job_trains_adapters_and_exports_a_merged_plain_folder(tmp_path, tiny_model, random_rollouts):
    cfg = GRPOConfig(steps=3, groups_per_step=4, checkpoint_every=1, lr=1e-2, lora_rank=4, max_epochs=4.0)
    job = write_job(tmp_path / "job", TrainJob(str(tiny_model), str(random_rollouts), cfg))
    exported = wait_training(start_training(job, n_procs=2, device="cpu"), job, timeout_s=300)
    assert [m["step"] for m in read_metrics(job)] == [1, 2, 3]
    assert not list(exported.glob("adapter_*")), "the candidate must be a plain folder, adapters merged"
    new, base = load_file(str(exported / "model.safetensors")), load_file(str(tiny_model / "model.safetensors"))
    assert set(new) == set(base)
    changed = {k for k in base if not torch.equal(new[k], base[k])}
    # only the projections LoRA adapts move; embeddings and norms stay the base model's
    assert changed and all(k.split(".")[-2] in cfg.lora_targets for k in changed)


def test_lora_with_zero3_is_refused():
    with pytest.raises(ValueError, match="lora_rank needs zero_stage <= 2"):
        GRPOConfig(lora_rank=8, zero_stage=3)
