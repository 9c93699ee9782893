"""The demo's closing table: failure rate with its interval, and where the cycle's time went."""
from pathlib import Path

from flows.demo.command import print_demo_table


def test_the_table_shows_rates_gate_and_time_outside_stages(capsys):
    summary = {"stage_seconds": {"ingest": 10.0, "train": 60.0},
               "stage_counts": {"curate": {"kept": 900}, "train": {"groups_kept": 40},
                                "train#1": {"groups_kept": 25}, "promote": {"reason": "promoted: gain +0.05"}}}
    by_domain = {"math": {"requests": 900, "failures": 423, "interval": (0.44, 0.50)},
                 "code": {"requests": 52, "failures": 52, "interval": (0.93, 1.0)},
                 "json": {"requests": 48, "failures": 25, "interval": (0.38, 0.66)}}
    rows = [{"cycle": 1, "production": "abc", "requests": 1000, "failure_rate": 0.5, "interval": (0.47, 0.53),
             "by_domain": by_domain, "cycle_seconds": 80.0, "summary": summary},
            {"cycle": 2, "production": "def", "requests": 1000, "failure_rate": 0.4, "interval": (0.37, 0.43),
             "by_domain": {"math": by_domain["math"]}}]
    print_demo_table(rows, Path("/tmp/demo"))
    out = capsys.readouterr().out
    assert "50.0% (47.0%..53.0%) of 1000" in out and "40.0% (37.0%..43.0%)" in out
    assert "423/900 = 47% (44%..50%)" in out and "52/52 = 100% (93%..100%)" in out
    assert "25/48 = 52% (38%..66%)" in out
    assert "900" in out and "65" in out  # tasks kept; groups trained over both rounds
    assert "promoted: gain +0.05" in out and "(final serve)" in out
    assert "10s (12%)" in out  # 80 s cycle, 70 s in stages


def test_the_demo_config_is_a_valid_cycle_config():
    import tomllib

    from flows.demo.flow import DEMO_TOML
    from tasks.cycle.config import cycle_config_from

    cfg = cycle_config_from(tomllib.loads(DEMO_TOML)["cycle"])
    assert cfg.rollout.domains == ("math", "code")
    assert cfg.evaluate.engine.temperature == 0.3


def test_the_demo_budgets_leave_room_for_a_function_in_the_tiny_model():
    """Code rides along in the demo only if the tiny model can write most reference
    solutions within its budget, after most prompts, in its context."""
    import random
    import tomllib

    from flows.demo.data.domains import sample_task
    from flows.demo.flow import DEMO_TOML, DemoConfig
    from flows.demo.tiny_model import ModelConfig
    from flows.demo.tokenizer import build_tokenizer
    from tasks.cycle.config import cycle_config_from

    cfg = cycle_config_from(tomllib.loads(DEMO_TOML)["cycle"])
    context, tokenizer, rng = ModelConfig().max_position_embeddings, build_tokenizer(), random.Random(0)
    for domain in ("code", "json"):
        budgets = {cfg.rollout.engine.budget(domain), cfg.evaluate.engine.budget(domain),
                   DemoConfig().traffic.max_tokens_by_domain[domain]}
        assert len(budgets) == 1, f"{domain}: rollouts, evaluation and traffic sample with different budgets"
        (budget,) = budgets
        tasks = [sample_task(domain, rng) for _ in range(200)]
        prompts = [len(tokenizer.apply_chat_template([{"role": "user", "content": t["prompt"]}],
                                                     add_generation_prompt=True)["input_ids"]) for t in tasks]
        answers = [len(tokenizer(t["gold"])["input_ids"]) + 1 for t in tasks]  # + the end-of-turn token
        assert sum(p + budget <= context for p in prompts) >= 0.85 * len(tasks), domain
        assert sum(a <= budget for a in answers) >= 0.75 * len(tasks), domain
