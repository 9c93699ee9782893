import json

import pytest

from verifiers.verdict import INFRA_STATUSES, DETAIL_MAX_CHARS, Verdict, failed


def test_round_trips_through_json():
    verdict = Verdict(reward=0.5, passed=False, status="wrong", components={"format": 1}, detail="x")
    assert Verdict.from_dict(json.loads(json.dumps(verdict.to_dict()))) == verdict
    assert verdict.components == {"format": 1.0}


@pytest.mark.parametrize("reward", [-0.1, 1.5, float("nan")])
def test_rejects_reward_outside_unit_interval(reward):
    with pytest.raises(ValueError, match="reward"):
        Verdict(reward=reward, passed=False, status="wrong")


def test_rejects_unknown_status_and_passed_without_ok():
    with pytest.raises(ValueError, match="status"):
        Verdict(reward=0.0, passed=False, status="fine")
    with pytest.raises(ValueError, match="passed"):
        Verdict(reward=1.0, passed=True, status="wrong")


def test_detail_is_truncated_and_infra_failures_are_marked():
    verdict = failed("timeout", "x" * 10_000)
    assert len(verdict.detail) <= DETAIL_MAX_CHARS and verdict.detail.endswith("chars, cut]")
    assert verdict.status in INFRA_STATUSES and failed("wrong", "").status not in INFRA_STATUSES
