"""The demo's closing table: failure rate with its interval, and where the cycle's time went."""
from pathlib import Path

from flows.demo.command import print_demo_table


def test_the_table_shows_rates_gate_and_time_outside_stages(capsys):
    summary = {"stage_seconds": {"ingest": 10.0, "train": 60.0},
               "stage_counts": {"curate": {"kept": 900}, "train": {"groups_kept": 40},
                                "train#1": {"groups_kept": 25}, "promote": {"reason": "promoted: gain +0.05"}}}
    rows = [{"cycle": 1, "production": "abc", "requests": 1000, "failure_rate": 0.5, "interval": (0.47, 0.53),
             "cycle_seconds": 80.0, "summary": summary},
            {"cycle": 2, "production": "def", "requests": 1000, "failure_rate": 0.4, "interval": (0.37, 0.43)}]
    print_demo_table(rows, Path("/tmp/demo"))
    out = capsys.readouterr().out
    assert "50.0% (47.0%..53.0%) of 1000" in out and "40.0% (37.0%..43.0%)" in out
    assert "900" in out and "65" in out  # tasks kept; groups trained over both rounds
    assert "promoted: gain +0.05" in out and "(final serve)" in out
    assert "10s (12%)" in out  # 80 s cycle, 70 s in stages


def test_the_demo_config_is_a_valid_cycle_config():
    import tomllib

    from flows.demo.flow import DEMO_TOML
    from tasks.cycle.config import cycle_config_from

    cfg = cycle_config_from(tomllib.loads(DEMO_TOML)["cycle"])
    assert cfg.rollout.domains == ("math",)
    assert cfg.evaluate.engine.temperature == 0.3
