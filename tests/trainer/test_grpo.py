import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.trainer.conftest import score_tokens
from trainer.grpo import GRPOConfig, deepspeed_config, rank_rows, rows_trained, spread
from trainer.logprobs import token_logprobs
from trainer.rollout_data import group_rollouts, pad_batch, read_rollouts


def test_config_validation():
    with pytest.raises(ValueError, match="grpo, dapo or dr_grpo"):
        GRPOConfig(loss_agg="mean")
    with pytest.raises(ValueError, match="tis_cap must be >= 1"):
        GRPOConfig(tis_cap=0.5)
    with pytest.raises(ValueError, match="zero_stage must be 0-3"):
        GRPOConfig(zero_stage=4)


def test_deepspeed_config_is_bf16_only_on_gpu():
    cpu = deepspeed_config(GRPOConfig(), micro_batch=16, world_size=2, on_gpu=False)
    gpu = deepspeed_config(GRPOConfig(), micro_batch=16, world_size=2, on_gpu=True)
    assert (cpu["bf16"]["enabled"], gpu["bf16"]["enabled"]) == (False, True)
    assert cpu["zero_optimization"]["stage"] == 2 and cpu["train_batch_size"] == 32


def test_trainer_logprobs_match_the_reference_scorer(tiny_model, random_rollouts):
    rows = read_rollouts(random_rollouts)[:5]
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    batch = pad_batch(rows, pad_id=0)
    with torch.no_grad():
        logp, entropy = token_logprobs(model, batch, temperature=1.0, with_entropy=True)
    for i, r in enumerate(rows):
        expected = score_tokens(tiny_model, r["prompt_token_ids"], r["token_ids"])
        assert logp[i][batch["mask"][i]].tolist() == pytest.approx(expected, abs=1e-5)
        # the sampler's own logprobs (transformers engine) are the same numbers
        assert r["logprobs"] == pytest.approx(expected, abs=1e-4)
    assert (entropy[batch["mask"]] > 0).all()
    # spread puts per-token values back where the mask says
    values = [r["logprobs"] for r in rows]
    assert spread(batch["mask"], values)[batch["mask"]].tolist() == pytest.approx(sum(values, []))


def test_ranks_split_a_step_without_overlap(random_rollouts):
    groups = group_rollouts(read_rollouts(random_rollouts), scale_by_std=False)
    cfg = GRPOConfig(groups_per_step=3)
    whole, total = rank_rows(groups, 1, cfg, rank=0, world=1)
    parts = [rank_rows(groups, 1, cfg, rank=r, world=2)[0] for r in range(2)]
    assert sorted(parts[0] + parts[1]) == sorted(whole) and total == len(whole)
    assert not set(parts[0]) & set(parts[1])


def test_each_rank_scores_only_the_rows_it_trains_on(random_rollouts):
    """pi_old is scored per rank for the rows of its own steps: the ranks together cover
    every row a step trains on, each a share, and rows no step reaches are not scored."""
    groups = group_rollouts(read_rollouts(random_rollouts), scale_by_std=False)
    cfg = GRPOConfig(groups_per_step=3)
    steps = 2  # 6 group-uses of the kept groups (more than 6 of 16): some never reached
    reached = {i for s in range(steps) for i in rank_rows(groups, s, cfg, rank=0, world=1)[0]}
    assert rows_trained(groups, steps, cfg, rank=0, world=1) == sorted(reached)
    assert len(reached) < len(groups.rows)
    mine = [rows_trained(groups, steps, cfg, rank=r, world=2) for r in range(2)]
    assert set(mine[0]) | set(mine[1]) == reached
    assert all(len(m) < len(reached) for m in mine)
    for s in range(steps):
        for r in range(2):
            assert set(rank_rows(groups, s, cfg, rank=r, world=2)[0]) <= set(mine[r])


def test_steps_are_capped_by_passes_over_the_kept_groups():
    cfg = GRPOConfig(steps=8, groups_per_step=32, max_epochs=2.0)
    assert cfg.steps_for(400) == 8         # 8 x 32 = 256 group-uses: under two passes
    assert cfg.steps_for(65) == 5          # two passes over 65 groups: ceil(130 / 32)
    assert cfg.steps_for(1) == 1           # a job always takes at least one step
    with pytest.raises(ValueError, match="max_epochs must be > 0"):
        GRPOConfig(max_epochs=0)


class _Engine:
    """What train_step needs of a DeepSpeed engine, around a plain model, on one rank."""

    device = torch.device("cpu")

    def __init__(self, model):
        self.model = model

    def __call__(self, **kwargs):
        return self.model(**kwargs)

    def backward(self, loss):
        loss.backward()

    def step(self):
        pass


@pytest.mark.parametrize("loss_agg", ["dapo", "grpo", "dr_grpo"])
def test_a_step_cut_into_length_pieces_has_the_gradient_of_one_padded_batch(tiny_model, random_rollouts,
                                                                            loss_agg):
    from trainer.grpo import length_pieces, score_rows, train_step

    groups = group_rollouts(read_rollouts(random_rollouts), scale_by_std=False)
    grads, sums = [], []
    for micro_tokens in (10**9, 1):
        cfg = GRPOConfig(groups_per_step=4, loss_agg=loss_agg, micro_tokens=micro_tokens)
        model = AutoModelForCausalLM.from_pretrained(tiny_model)
        old = score_rows(model, groups.rows, cfg, 0, "cpu")
        sums.append(train_step(_Engine(model), groups, old, None, 0, cfg, 0, 1, pad_id=0))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)
    # the loss sits near an on-policy zero (~1e-9 of rounding noise): an absolute bound
    assert sums[1]["loss"] == pytest.approx(sums[0]["loss"], rel=1e-4, abs=1e-6)
    assert (sums[1]["tokens"], sums[1]["all_tokens"]) == (sums[0]["tokens"], sums[0]["all_tokens"])
    rows = [{"prompt_token_ids": [1] * n, "token_ids": [2]} for n in (9, 3, 4, 20)]
    assert length_pieces(rows, 12) == [[1, 2], [0], [3]]  # 2x(4+1) fits 12; 9+1 alone; 20+1 alone


def test_scoring_in_length_pieces_keeps_each_rows_logprobs(tiny_model, random_rollouts):
    from trainer.grpo import score_rows

    rows = read_rollouts(random_rollouts)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    whole = score_rows(model, rows, GRPOConfig(micro_tokens=10**9), 0, "cpu")
    pieces = score_rows(model, rows, GRPOConfig(micro_tokens=1, forward_chunk=3), 0, "cpu")
    assert [len(x) for x in whole] == [len(r["token_ids"]) for r in rows]
    for a, b in zip(whole, pieces, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
