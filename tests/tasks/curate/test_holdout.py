"""The held-out split: stable, close to the asked fraction, monotone in the fraction."""
import hashlib

import pytest

from tasks.curate.holdout import holdout_position, is_heldout

IDS = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(4000)]


def test_fraction_is_respected_and_stable():
    held = [t for t in IDS if is_heldout(t, 0.1)]
    assert 340 <= len(held) <= 460  # 10% of 4000, ~5 standard deviations of slack
    assert held == [t for t in IDS if is_heldout(t, 0.1)]  # same answer every time


def test_raising_the_fraction_never_moves_a_task_back_to_training():
    small = {t for t in IDS if is_heldout(t, 0.1)}
    large = {t for t in IDS if is_heldout(t, 0.3)}
    assert small < large
    assert not any(is_heldout(t, 0.0) for t in IDS) and all(is_heldout(t, 1.0) for t in IDS)


def test_position_is_a_fixed_value_in_unit_interval():
    pos = holdout_position("abc")
    expected = int.from_bytes(hashlib.sha256(b"flywheel-holdout:abc").digest()[:8], "big") / 2**64
    assert pos == expected and 0 <= pos < 1
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        is_heldout("abc", 1.5)
