"""The `[cycle]` section of flywheel.toml: nested tables become the stages' configs, a bad
setting is a ConfigError naming its path, and stage tasks read the file when they run.
(The gpu worker reading it is tests/flows/test_stack.py: the gate's reason names the
threshold the stack's flywheel.toml set.)"""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from storage.config_file import ConfigError
from tasks.cycle.config import CycleConfig, cycle_config, cycle_config_from

EXAMPLE = """
[cycle.rollout.engine]
backend = "transformers"
max_tokens = 16
[cycle.train.grpo]
lr = 1e-5
steps = 3
zero_stage = 3
[cycle.gate]
min_gain = 0.01
[cycle.ingest.rules]
known_verifiers = ["math", "code", "json_schema"]
"""


def test_a_toml_section_fills_the_nested_stage_configs():
    config = cycle_config_from(tomllib.loads(EXAMPLE)["cycle"])
    defaults = CycleConfig()
    assert (config.rollout.engine.backend, config.rollout.engine.max_tokens) == ("transformers", 16)
    assert (config.train.grpo.lr, config.train.grpo.steps, config.train.grpo.zero_stage) == (1e-5, 3, 3)
    assert config.gate.min_gain == 0.01
    assert config.ingest.rules.known_verifiers == ("math", "code", "json_schema")  # a TOML list, as the tuple
    # what the file does not name keeps its default, at every level
    assert config.rollout.engine.n == defaults.rollout.engine.n
    assert config.rollout.tasks_per_round == defaults.rollout.tasks_per_round
    assert config.train.grpo.groups_per_step == defaults.train.grpo.groups_per_step
    assert (config.curate, config.verify, config.evaluate) == (defaults.curate, defaults.verify, defaults.evaluate)


def test_an_empty_or_missing_section_is_the_defaults(tmp_path, monkeypatch):
    assert cycle_config_from({}) == CycleConfig()
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(tmp_path / "absent.toml"))
    assert cycle_config() == CycleConfig()


def test_an_integer_fills_a_float_but_not_the_reverse():
    assert cycle_config_from({"train": {"grpo": {"grad_clip": 2}}}).train.grpo.grad_clip == 2.0
    with pytest.raises(ConfigError, match=r"^cycle\.train\.grpo\.steps = 2\.5: expected an integer"):
        cycle_config_from({"train": {"grpo": {"steps": 2.5}}})


@pytest.mark.parametrize("section, message", [
    ({"train": {"grpo": {"lrr": 1e-5}}}, r"^cycle\.train\.grpo\.lrr is not a setting; known: steps, groups_per_step,"),
    ({"rollouts": {}}, r"^cycle\.rollouts is not a setting; known: ingest, curate, rollout,"),
    ({"train": {"grpo": {"lr": "fast"}}}, r"^cycle\.train\.grpo\.lr = 'fast': expected a number, not a string"),
    ({"rollout": {"engine": {"backend": "tgi"}}}, r"^cycle\.rollout\.engine\.backend = 'tgi': expected one of 'vllm'"),
    ({"train": {"grpo": {"zero_stage": True}}}, r"^cycle\.train\.grpo\.zero_stage = True: expected one of 0, 1, 2, 3"),
    ({"rollout": {"curriculum": 1}}, r"^cycle\.rollout\.curriculum = 1: expected true or false"),
    ({"ingest": {"rules": {"known_verifiers": ["math", 2]}}}, r"^cycle\.ingest\.rules\.known_verifiers\[1\] = 2"),
    ({"train": 8}, r"^cycle\.train must be a table \(\[cycle\.train\] in flywheel\.toml\), not an integer"),
    # the stage's own __post_init__ judges the value; the message says where it was set
    ({"train": {"grpo": {"steps": 0}}}, r"^cycle\.train\.grpo: GRPOConfig\.steps and groups_per_step must be >= 1"),
    ({"gate": {"min_gain": 2.0}}, r"^cycle\.gate: min_gain is a difference of pass rates"),
    ({"rollout": {"engine": {"temperature": 0.7}}},
     r"cycle\.train\.grpo\.temperature \(1\.0\) must equal cycle\.rollout\.engine\.temperature \(0\.7\)"),
    ({"rollout": {"max_staleness": -1}}, r"^cycle\.rollout: RolloutConfig\.max_staleness must be >= 0"),
    ({"rollout": {"engine": {"max_tokens_by_domain": {"code": 9000}}}},
     r"max_tokens_by_domain\['code'\] must be an integer from 1 to below max_model_len \(4096\)"),
])
def test_a_bad_setting_is_a_config_error_naming_its_path(section, message):
    with pytest.raises(ConfigError, match=message):
        cycle_config_from(section)


def test_a_variable_wins_over_the_file_and_is_checked_the_same_way():
    section = tomllib.loads(EXAMPLE)["cycle"]
    env = {"FLYWHEEL_CYCLE_TRAIN_GRPO_LR": "2e-4", "FLYWHEEL_CYCLE_TRAIN_GRPO_ZERO_STAGE": "1",
           "FLYWHEEL_CYCLE_TRAIN_GRPO_TIS_CAP": "3", "FLYWHEEL_CYCLE_VERIFY_VERIFIERS_DOMAIN_MAP": '{"m": "math"}'}
    config = cycle_config_from(section, env=env)
    assert (config.train.grpo.lr, config.train.grpo.zero_stage, config.train.grpo.tis_cap) == (2e-4, 1, 3.0)
    assert config.verify.verifiers.domain_map == {"m": "math"}
    assert config.train.grpo.steps == 3  # the file's, where no variable names it
    with pytest.raises(ConfigError, match=r"^FLYWHEEL_CYCLE_ROLLOUT_ENGINE_BACKEND = 'tgi': expected one of"):
        cycle_config_from({}, env={"FLYWHEEL_CYCLE_ROLLOUT_ENGINE_BACKEND": "tgi"})


def test_the_file_is_read_when_a_stage_asks_not_when_the_module_loaded(tmp_path, monkeypatch):
    path = tmp_path / "flywheel.toml"
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(path))
    path.write_text('[lake]\nhome = "x"\n[cycle.gate]\nmin_gain = 0.02\n')  # other sections are not its business
    assert cycle_config().gate.min_gain == 0.02
    path.write_text("[cycle.gate]\nmin_gain = 0.03\n")
    assert cycle_config().gate.min_gain == 0.03
    monkeypatch.setenv("FLYWHEEL_CYCLE_GATE_MIN_GAIN", "0.04")
    assert cycle_config().gate.min_gain == 0.04
    path.write_text("[cycle.gate]\nmin_gian = 0.03\n")
    with pytest.raises(ConfigError, match=r"^cycle\.gate\.min_gian is not a setting"):
        cycle_config()


def test_flywheel_cycle_refuses_a_bad_section_with_the_path_not_a_traceback(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli.app import app

    (tmp_path / "flywheel.toml").write_text("[cycle.train.grpo]\nlrr = 1e-5\n")
    monkeypatch.chdir(tmp_path)  # the file a worker's flow run finds: ./flywheel.toml
    monkeypatch.delenv("FLYWHEEL_CONFIG", raising=False)
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at the terminal width
    result = CliRunner().invoke(app, ["cycle"])
    assert result.exit_code == 2, result.output
    assert "cycle.train.grpo.lrr is not a setting; known: steps" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "home").exists()  # nothing ran


def test_the_compose_stacks_config_file_is_valid():
    path = Path(__file__).resolve().parents[3] / "config" / "flywheel.toml"
    cfg = cycle_config_from(tomllib.loads(path.read_text())["cycle"])
    assert cfg.train.grpo.lr == 3e-5 and cfg.rollout.engine.backend == "vllm"


def test_one_domain_map_reaches_every_stage_from_its_own_table_or_any_older_path():
    for section in ({"domains": {"arith": "math"}},
                    {"curate": {"verifiers": {"domain_map": {"arith": "math"}}}},
                    {"ingest": {"rules": {"domain_map": {"arith": "math"}}},
                     "evaluate": {"verifiers": {"domain_map": {"arith": "math"}}}}):
        config = cycle_config_from(section)
        maps = [config.domains, config.ingest.rules.domain_map, config.curate.verifiers.domain_map,
                config.verify.verifiers.domain_map, config.evaluate.verifiers.domain_map]
        assert maps == [{"arith": "math"}] * 5, section
    from_env = cycle_config_from({}, env={"FLYWHEEL_CYCLE_DOMAINS": '{"m": "code"}'})
    assert from_env.ingest.rules.domain_map == {"m": "code"}


def test_two_different_domain_maps_are_refused_naming_both_places():
    section = {"domains": {"a": "math"}, "verify": {"verifiers": {"domain_map": {"b": "math"}}}}
    with pytest.raises(ConfigError, match=r"cycle\.domains, cycle\.verify\.verifiers\.domain_map; set it once"):
        cycle_config_from(section)
    with pytest.raises(ConfigError, match=r"domains: domain_map names unknown verifiers \{'a': 'abacus'\}"):
        cycle_config_from({"domains": {"a": "abacus"}})


def test_stale_rounds_need_the_importance_weight_that_corrects_them():
    from dataclasses import replace

    from trainer.grpo import GRPOConfig

    plain = CycleConfig()
    no_tis = replace(plain.train, grpo=GRPOConfig(tis_cap=None))
    with pytest.raises(ConfigError, match="max_staleness > 0 samples rounds with an older policy"):
        CycleConfig(train=no_tis)
    assert CycleConfig(train=no_tis, rollout=replace(plain.rollout, max_staleness=0)).rollout.max_staleness == 0
