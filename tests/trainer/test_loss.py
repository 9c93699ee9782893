"""GRPO loss pieces against values computed by hand."""

import math

import pytest
import torch

from trainer.loss import (aggregate, clipped_surrogate, group_advantages, k3_kl, keep_groups,
                          policy_loss, tis_weights, valid_mask)

T = torch.tensor


def test_advantages_are_mean_centred_per_group():
    adv = group_advantages(T([[1.0, 0, 0, 1], [1, 1, 1, 0]]))
    assert torch.allclose(adv, T([[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]]))


def test_advantages_scaled_by_population_std_when_asked():
    adv = group_advantages(T([[1.0, 0, 0, 1], [1, 1, 1, 0]]), scale_by_std=True)
    s = math.sqrt(0.1875)  # population std of (1, 1, 1, 0)
    expected = T([[1.0, -1, -1, 1], [0.25 / s, 0.25 / s, 0.25 / s, -0.75 / s]])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_invalid_rollouts_are_masked_not_scored_zero():
    rewards = T([[1.0, 0, 0, 0]])
    valid = valid_mask(["ok", "wrong", "timeout", "sandbox_error"]).reshape(1, 4)
    adv = group_advantages(rewards, valid)
    # Mean over the two real verdicts is 0.5; scoring the failures 0 would give 0.25.
    assert torch.allclose(adv, T([[0.5, -0.5, 0.0, 0.0]]))


def test_zero_variance_groups_are_dropped():
    rewards = T([[1.0, 1], [0, 1], [0, 0], [1, 0]])
    valid = T([[True, True], [True, True], [True, True], [True, False]])
    assert keep_groups(rewards, valid).tolist() == [False, True, False, False]
    assert keep_groups(rewards).tolist() == [False, True, False, True]


@pytest.mark.parametrize("ratio, adv, expected_loss, clipped", [
    (1.5, 1.0, -1.2, True),     # gain capped at 1 + eps_high
    (1.5, -1.0, 1.5, False),    # a worse action made likelier is never clipped
    (0.5, -1.0, 0.8, True),     # capped at 1 - eps_low
    (0.5, 1.0, -0.5, False),
])
def test_clipping_on_both_sides(ratio, adv, expected_loss, clipped):
    logp = T([[math.log(ratio)]], requires_grad=True)
    loss, is_clipped = clipped_surrogate(logp, T([[0.0]]), T([[adv]]), eps_low=0.2, eps_high=0.2)
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    assert is_clipped.item() is clipped
    loss.sum().backward()
    # A clipped token contributes no gradient; an unclipped one does.
    assert (logp.grad.abs().item() == 0) is clipped


def test_clip_higher_lets_rare_tokens_grow_further():
    logp = T([[math.log(1.25)]])
    tight, _ = clipped_surrogate(logp, T([[0.0]]), T([[1.0]]), eps_low=0.2, eps_high=0.2)
    loose, _ = clipped_surrogate(logp, T([[0.0]]), T([[1.0]]), eps_low=0.2, eps_high=0.28)
    assert tight.item() == pytest.approx(-1.2)
    assert loose.item() == pytest.approx(-1.25)


def test_aggregation_modes():
    per_token = T([[1.0, 2, 3], [4, 0, 0]])
    mask = T([[1, 1, 1], [1, 0, 0]])
    assert aggregate(per_token, mask, "grpo", max_tokens=3).item() == pytest.approx((2 + 4) / 2)
    assert aggregate(per_token, mask, "dapo", max_tokens=3).item() == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "dr_grpo", max_tokens=3).item() == pytest.approx(10 / 6)
    assert aggregate(per_token, mask, "dapo", 3, total_tokens=8).item() == pytest.approx(10 / 8)
    with pytest.raises(ValueError, match="grpo, dapo or dr_grpo"):
        aggregate(per_token, mask, "mean", max_tokens=3)


def test_k3_kl():
    kl = k3_kl(T([math.log(0.5), 0.0]), T([math.log(0.25), 0.0]))
    assert kl.tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0], abs=1e-6)


def test_tis_weights_are_truncated_constants():
    old = T([math.log(0.5), math.log(0.1)], requires_grad=True)
    w = tis_weights(old, T([math.log(0.1), math.log(0.2)]), cap=2.0)
    assert w.tolist() == pytest.approx([2.0, 0.5])
    assert not w.requires_grad


def test_policy_loss_combines_pieces():
    # Two sequences, on-policy (ratio 1), second has one padded position.
    logp = T([[math.log(0.5), math.log(0.5)], [math.log(0.25), 0.0]], requires_grad=True)
    old = logp.detach().clone()
    behaviour = old - math.log(4)  # vLLM thought the tokens 4x less likely: weight capped at 2
    mask = T([[1, 1], [1, 0]])
    loss, stats = policy_loss(logp, old, behaviour, T([1.0, -1.0]), mask, mode="dapo",
                              max_tokens=2, eps_low=0.2, eps_high=0.2, tis_cap=2.0)
    # per-token: -2*1, -2*1, +2*1 over 3 tokens
    assert loss.item() == pytest.approx(-2 / 3)
    assert {k: float(v) for k, v in stats.items()} == {"kl": pytest.approx(0.0, abs=1e-7),
                                                       "clip_frac": pytest.approx(0.0, abs=1e-7)}
    ref = old - 0.1
    with_kl, _ = policy_loss(logp, old, behaviour, T([1.0, -1.0]), mask, mode="dapo", max_tokens=2,
                             eps_low=0.2, eps_high=0.2, tis_cap=2.0, kl_coef=0.5, ref_logp=ref)
    assert with_kl.item() == pytest.approx(-2 / 3 + 0.5 * (math.exp(-0.1) + 0.1 - 1), abs=1e-6)


def test_kl_coef_without_reference_is_an_error():
    x = T([[0.0]])
    with pytest.raises(ValueError, match="ref_model"):
        policy_loss(x, x, x, T([1.0]), T([[1]]), mode="grpo", max_tokens=1, eps_low=0.2,
                    eps_high=0.2, tis_cap=None, kl_coef=0.1)
