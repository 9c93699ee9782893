"""Where a cycle stands: the stages' wall time counted once where overlapped rounds ran two at once."""
from tasks.cycle.state import busy_seconds


def test_busy_seconds_counts_overlapping_stages_once():
    # rollout 0, then train 0 beside rollout 1 (overlapped rounds), a gap, evaluate
    spans = [(0.0, 10.0), (10.0, 40.0), (12.0, 30.0), (50.0, 55.0)]
    assert busy_seconds(spans) == 45.0
    assert busy_seconds([(5.0, 6.0), (0.0, 10.0)]) == 10.0  # one span inside another
    assert busy_seconds([]) == 0.0
