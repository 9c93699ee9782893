"""The promotion gate on synthetic score tables: win, loss, noise, a regressing domain."""
import numpy as np
import pytest

from tasks.release.gate import GateConfig, bootstrap_ci, decide

CFG = GateConfig(seed=1)


def table(scores, domains=None, eval_set="heldout"):
    domains = domains or ["math"] * len(scores)
    return [{"eval_set": eval_set, "item_id": f"i{k}", "domain": d, "score": float(s)}
            for k, (s, d) in enumerate(zip(scores, domains))]


def rates(rng, p, n_items, g=8):
    """Pass rates of n_items items, each G samples with per-item success probability p."""
    return rng.binomial(g, np.clip(p, 0, 1), size=n_items) / g


def test_clear_win_is_promoted():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.1, 0.6, 200)
    d = decide(table(rates(rng, base + 0.25, 200)), table(rates(rng, base, 200)), CFG)
    assert d.promoted, d.reason
    assert d.reason.startswith("promoted") and 0 < d.low < d.diff < d.high
    assert d.items == 200 and d.unpaired == 0


def test_clear_loss_is_rejected_with_the_failing_bound():
    rng = np.random.default_rng(1)
    base = rng.uniform(0.4, 0.9, 200)
    d = decide(table(rates(rng, base - 0.2, 200)), table(rates(rng, base, 200)), CFG)
    assert not d.promoted and d.high < 0
    assert "lower bound is not above min_gain" in d.reason


def test_noise_is_not_promoted():
    # Same model twice: the interval straddles zero, so the lower bound is not > 0.
    rng = np.random.default_rng(2)
    base = rng.uniform(0.2, 0.8, 150)
    d = decide(table(rates(rng, base, 150)), table(rates(rng, base, 150)), CFG)
    assert not d.promoted and d.low < 0 < d.high


def test_a_regressing_domain_blocks_an_overall_win():
    rng = np.random.default_rng(3)
    domains = ["math"] * 180 + ["code"] * 20
    base = rng.uniform(0.2, 0.6, 200)
    cand = base + np.where(np.array(domains) == "math", 0.3, -0.15)
    d = decide(table(rates(rng, cand, 200), domains), table(rates(rng, base, 200), domains), CFG)
    assert d.low > 0, "overall the candidate is clearly better"
    assert not d.promoted and "domain 'code' regresses" in d.reason
    code = next(x for x in d.domains if x.domain == "code")
    assert code.regressed and code.items == 20 and code.low <= code.diff <= code.high
    # the same table passes once the tolerance allows the drop
    loose = GateConfig(seed=1, domain_tolerance=0.5)
    assert decide(table(rates(np.random.default_rng(0), cand, 200), domains),
                  table(rates(np.random.default_rng(9), base, 200), domains), loose).promoted


def test_min_gain_raises_the_bar():
    cand, prod = table([0.6] * 50 + [0.5] * 50), table([0.5] * 100)
    assert decide(cand, prod, CFG).promoted  # +0.05, every resample positive
    assert not decide(cand, prod, GateConfig(seed=1, min_gain=0.1)).promoted


def test_only_paired_items_count_and_fresh_failures_count_too():
    cand = table([1.0] * 30) + table([1.0] * 30, eval_set="fresh-failures") + [
        {"eval_set": "heldout", "item_id": "only-cand", "domain": "math", "score": 0.0}]
    prod = table([0.0] * 30) + table([0.0] * 30, eval_set="fresh-failures")
    d = decide(cand, prod, CFG)
    assert d.items == 60 and d.unpaired == 1 and d.diff == 1.0
    assert not decide([], prod, CFG).promoted


def test_decision_is_reproducible_from_the_seed():
    rng = np.random.default_rng(4)
    a, b = table(rates(rng, np.full(80, 0.5), 80)), table(rates(rng, np.full(80, 0.45), 80))
    assert decide(a, b, CFG) == decide(a, b, CFG)
    assert decide(a, b, CFG).low != decide(a, b, GateConfig(seed=2)).low


def test_bootstrap_ci_of_a_mean_covers_it():
    values = np.random.default_rng(5).uniform(size=300)
    low, high = bootstrap_ci(values, CFG)
    assert low < values.mean() < high and high - low < 0.1


def test_config_says_how_to_fix_a_bad_value():
    with pytest.raises(ValueError, match="resamples must be >= 1000"):
        GateConfig(resamples=100)
    with pytest.raises(ValueError, match="tolerance"):
        GateConfig(domain_tolerance=-0.1)
    with pytest.raises(ValueError, match="twice"):
        decide(table([1.0]) + table([0.0]), table([1.0]), CFG)
