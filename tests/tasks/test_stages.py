"""The stage table: one contract for every stage, and a run's overrides of flywheel.toml."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from flows.cycle_params import OVERRIDES, CycleParams
from storage.config_file import ConfigError
from tasks.cycle.config import CycleConfig, cycle_config
from tasks.stages import STAGES, StageKey


def test_every_stage_has_one_contract_in_pipeline_order():
    assert list(STAGES) == ["ingest", "curate", "rollout", "verify", "train", "evaluate", "gate", "promote"]
    sections = {f.name for f in dataclasses.fields(CycleConfig)}
    for name, stage in STAGES.items():
        assert list(inspect.signature(stage.run).parameters) == ["con", "cfg", "key"], name
        names = (stage.config,) if isinstance(stage.config, str) else stage.config or ()
        assert set(names) <= sections, name
    # only stages that read or write the object store retry
    assert {name for name, stage in STAGES.items() if stage.retries} == {"ingest"}


def test_a_key_is_small_and_frozen():
    key = StageKey("c1", 2, policy="v1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.round = 3  # type: ignore[misc]
    assert hash(key) == hash(StageKey("c1", 2, policy="v1"))


def test_the_file_decides_unless_the_run_gives_a_value(tmp_path, monkeypatch):
    toml = tmp_path / "flywheel.toml"
    toml.write_text("[cycle.rollout]\ntasks_per_round = 12\n[cycle.rollout.engine]\nn = 6\n")
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(toml))
    configured = cycle_config(CycleParams().overrides())
    assert (configured.rollout.tasks_per_round, configured.rollout.engine.n) == (12, 6)
    given = cycle_config(CycleParams(tasks_per_round=3, eval_samples=2).overrides())
    assert (given.rollout.tasks_per_round, given.rollout.engine.n, given.evaluate.engine.n) == (3, 6, 2)


def test_every_override_names_a_setting():
    for name, path in OVERRIDES.items():
        assert cycle_config({path: 4}) is not None, name
    with pytest.raises(ConfigError, match="cycle.rollout.tasks_per_round = 0"):
        cycle_config({"rollout.tasks_per_round": 0})
    with pytest.raises(ConfigError, match="cycle.rollout.nope is not a setting"):
        cycle_config({"rollout.nope": 1})
