"""pass@k against values worked out by hand from 1 - C(n-c, k) / C(n, k)."""
import math

import pytest

from tasks.release.passk import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize("n,c,k,expected", [
    (5, 2, 1, 2 / 5),                     # pass@1 = c / n
    (5, 2, 2, 1 - 3 / 10),                # C(3,2)=3, C(5,2)=10
    (10, 3, 5, 1 - 21 / 252),             # C(7,5)=21, C(10,5)=252
    (4, 0, 2, 0.0),                       # nothing passes
    (4, 3, 2, 1.0),                       # n - c < k: every pair holds a pass
    (8, 1, 8, 1.0),
    (8, 1, 4, 1 - 35 / 70),               # C(7,4)=35, C(8,4)=70
])
def test_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_stable_where_binomials_overflow_floats():
    # C(2000, 500) is ~1e486, far beyond float range; the product form is still exact enough.
    exact = 1 - math.comb(1990, 500) / math.comb(2000, 500)
    assert pass_at_k(2000, 10, 500) == pytest.approx(exact, rel=1e-9)


def test_mean_over_items_and_pass1_is_mean_rate():
    assert mean_pass_at_k([4, 4, 4], [0, 2, 4], 1) == pytest.approx((0 + 0.5 + 1) / 3)
    assert mean_pass_at_k([4, 4], [1, 2], 2) == pytest.approx((0.5 + 5 / 6) / 2)  # 1-3/6, 1-1/6
    assert math.isnan(mean_pass_at_k([], [], 1))


def test_refuses_impossible_counts():
    with pytest.raises(ValueError, match="at least k=5"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)
