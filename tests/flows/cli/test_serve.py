"""`flywheel serve` against a real Prefect server: pools, deployments, schedules that follow flywheel.toml."""
from __future__ import annotations

import dataclasses
import subprocess

import pytest
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows import deployments
from flows.deployments import DEPLOYMENTS, IngestParams, ScheduleConfig
from flows.cli.serve import register_deployments
from storage.settings import LakeSettings
from tests.flows.prefect_stack import flywheel_bin, prefect_env, register


def read_deployment(server, name: str):
    with temporary_settings({PREFECT_API_URL: server.api_url}), get_client(sync_client=True) as client:
        found = [d for d in client.read_deployments() if d.name == name]
        assert len(found) == 1, f"{name}: {len(found)} deployments"
        return found[0], {p.name: p.type for p in client.read_work_pools()}


def test_serve_refuses_without_a_prefect_server(tmp_path):
    done = subprocess.run([flywheel_bin(), "serve"], cwd=tmp_path, env=prefect_env(tmp_path / "prefect"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "PREFECT_API_URL" in done.stdout + done.stderr


def test_serve_registers_pools_and_follows_flywheel_toml(prefect_server, tmp_path):
    toml = tmp_path / "flywheel.toml"
    toml.write_text('[schedule]\ncycle_cron = "0 2 * * *"\ningest_interval_s = 600\n')
    output = register(prefect_server, tmp_path)
    assert "registered ingest (pool cpu, every 600s)" in output
    assert "registered evaluate (pool gpu, on demand)" in output
    maintenance, _ = read_deployment(prefect_server, "lake-maintenance")
    assert maintenance.work_pool_name == "cpu" and maintenance.parameters == {}
    assert [s.schedule.cron for s in maintenance.schedules] == ["0 6 * * *"]
    ingest, pools = read_deployment(prefect_server, "ingest")
    assert pools["cpu"] == pools["gpu"] == "process"
    assert ingest.work_pool_name == "cpu" and ingest.entrypoint == "flows.ingest.ingest_flow"
    assert ingest.parameters == {"paths": [str(tmp_path / ".flywheel" / "landing")]}
    assert [s.schedule.interval.total_seconds() for s in ingest.schedules] == [600]

    toml.write_text('[schedule]\ncycle_cron = "30 4 * * 1-5"\ningest_interval_s = 900\n')
    register(prefect_server, tmp_path)
    again, _ = read_deployment(prefect_server, "ingest")
    assert again.id == ingest.id
    assert [s.schedule.interval.total_seconds() for s in again.schedules] == [900]
    cycle, _ = read_deployment(prefect_server, "flywheel-cycle")
    assert [s.schedule.cron for s in cycle.schedules] == ["30 4 * * 1-5"] and cycle.work_pool_name == "gpu"


def test_a_changed_cron_replaces_the_schedule(prefect_server, tmp_path, monkeypatch):
    monkeypatch.setitem(DEPLOYMENTS, "evaluate", dataclasses.replace(DEPLOYMENTS["evaluate"], flow_path="flows.absent_eval:f"))
    settings = LakeSettings(home=tmp_path / "home")
    with temporary_settings({PREFECT_API_URL: prefect_server.api_url}):
        register_deployments(ScheduleConfig(cycle_cron="0 2 * * *"), settings, str(tmp_path))
        lines = register_deployments(ScheduleConfig(cycle_cron="15 3 * * 0", timezone="Europe/Paris"),
                                     settings, str(tmp_path))
    assert any("flywheel-cycle" in line and "15 3 * * 0" in line for line in lines)
    cycle, _ = read_deployment(prefect_server, "flywheel-cycle")
    assert [(s.schedule.cron, s.schedule.timezone) for s in cycle.schedules] == [("15 3 * * 0", "Europe/Paris")]
    assert cycle.work_pool_name == "gpu"


@pytest.mark.parametrize("bad", [dict(cycle_cron="0 2 * *"), dict(cycle_cron="61 * * * *"),
                                 dict(cycle_cron="H 2 * * *"), dict(timezone="Mars/Olympus"),
                                 dict(ingest_interval_s=0)])
def test_schedule_config_refuses_what_prefect_would(bad):
    with pytest.raises(ValueError):
        ScheduleConfig(**bad)


def test_a_missing_flow_module_is_skipped_but_a_broken_one_is_not(monkeypatch, tmp_path):
    spec = dataclasses.replace(DEPLOYMENTS["evaluate"], flow_path="flows.not_built_yet:evaluate_flow")
    assert deployments.load_flow(spec) is None
    broken = tmp_path / "broken_flow_mod.py"
    broken.write_text("import a_dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError):
        deployments.load_flow(dataclasses.replace(spec, flow_path="broken_flow_mod:f"))


def test_a_parameter_model_that_disagrees_with_its_flow_is_refused():
    from pydantic import BaseModel

    class NoFields(BaseModel):
        pass

    spec = dataclasses.replace(DEPLOYMENTS["ingest"], params=NoFields)
    with pytest.raises(deployments.DeploymentError, match="requires \\['paths'\\]"):
        deployments.load_flow(spec)


def test_ingest_params_mirror_the_flow():
    from flows.ingest import ingest_flow

    deployments.check_params(DEPLOYMENTS["ingest"], ingest_flow)
    import inspect

    flow_default = inspect.signature(ingest_flow.fn).parameters["chunk_lines"].default
    assert IngestParams(paths=["a"]).chunk_lines == flow_default


def test_the_cycle_parameter_mirror_matches_the_cycle_flow():
    from flows.flywheel import flywheel_cycle

    deployments.check_params(DEPLOYMENTS["flywheel-cycle"], flywheel_cycle)


def test_the_evaluate_parameter_mirror_matches_the_evaluate_flow():
    from flows.evaluate import evaluate_flow

    deployments.check_params(DEPLOYMENTS["evaluate"], evaluate_flow)
    assert DEPLOYMENTS["evaluate"].pool == "gpu" and DEPLOYMENTS["evaluate"].schedule is None
    # what the webhook accepts is what the flow accepts
    body = {"params": {"policy_version": "abc", "eval_samples": 4, "apply_gate": True}}
    assert deployments.EvaluateRequest.model_validate(body).params.eval_samples == 4
    with pytest.raises(ValueError):
        deployments.EvaluateRequest.model_validate({"params": {"eval_samples": 0}})


def test_lake_maintenance_takes_no_parameters_and_its_cron_is_checked():
    from flows.maintain import lake_maintenance_flow

    deployments.check_params(DEPLOYMENTS["lake-maintenance"], lake_maintenance_flow)
    with pytest.raises(ValueError):
        deployments.NoParams.model_validate({"retention": 1})
    with pytest.raises(ValueError, match="maintenance_cron"):
        ScheduleConfig(maintenance_cron="0 6 * *")


def test_a_drifted_mirror_is_refused():
    from pydantic import BaseModel, Field

    class Drifted(deployments.CycleParams):
        rounds: int = Field(1, ge=1, le=99)

    class Wrapper(BaseModel):
        params: Drifted = Field(default_factory=Drifted)

    with pytest.raises(deployments.DeploymentError, match="update the mirror"):
        deployments.load_flow(dataclasses.replace(DEPLOYMENTS["flywheel-cycle"], params=Wrapper))


def test_a_parameter_model_naming_what_the_flow_lacks_is_refused():
    spec = dataclasses.replace(DEPLOYMENTS["ingest"], params=deployments.CycleRequest)
    with pytest.raises(deployments.DeploymentError, match="does not accept"):
        deployments.load_flow(spec)
