"""docker-compose.yml, checked without a Docker engine.

The file must satisfy the Compose specification's JSON schema (tests/data/compose-spec.json
is schema/compose-spec.json of github.com/compose-spec/compose-spec at commit 00655e22,
vendored unchanged), every command a service runs must be a real command of this project's
environment with options that command accepts, and names must agree: variables
with .env.example, volumes with their declarations, health checks with the ports the
commands listen on.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SCHEMA = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
SERVICES = COMPOSE["services"]
OUR_IMAGES = {"flywheel:cpu", "flywheel:gpu"}
ONE_SHOT = {name for name, svc in SERVICES.items() if svc.get("restart") == "no"}
_VAR = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}")


def env_example() -> dict[str, str]:
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip('"')
    return values


def test_compose_file_satisfies_the_compose_specification():
    jsonschema.Draft7Validator(SCHEMA).validate(COMPOSE)


def test_the_vendored_schema_is_the_current_specification():
    # the 2021 revision had no top-level `name`, `include` or `models`; a file using them
    # would pass here and still be checked against rules Compose no longer applies
    assert {"name", "include", "models"} <= set(SCHEMA["properties"])
    assert "gpus" in SCHEMA["definitions"]["service"]["properties"]
    assert COMPOSE["name"] == "flywheel"


def test_the_schema_check_catches_a_broken_file():
    broken = {"services": {"webhook": {"image": "x", "healthcheck": {"test": ["CMD"], "interval": 5, "colour": 1}}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(SCHEMA).validate(broken)


def test_the_stack_has_every_service_the_issue_asks_for():
    expected = {"minio", "minio-init", "postgres", "prefect-server", "cpu-worker", "webhook",
                "dask-scheduler", "dask-worker", "gpu-worker", "mlflow", "gateway", "gateway-gpu", "vllm"}
    assert expected <= set(SERVICES)
    assert SERVICES["vllm"]["profiles"] == ["vllm"] and "profiles" not in SERVICES["gateway"]
    # the GPU profile serves in managed mode (no upstream: it follows promotions on its own),
    # on its own host port and spool
    gpu_gateway = SERVICES["gateway-gpu"]
    assert gpu_gateway["profiles"] == ["gpu"] and gpu_gateway["image"] == "flywheel:gpu"
    assert "FLYWHEEL_GATEWAY_UPSTREAM" not in gpu_gateway["environment"]
    assert gpu_gateway["command"] == SERVICES["gateway"]["command"]
    assert gpu_gateway["ports"] != SERVICES["gateway"]["ports"]
    assert gpu_gateway["environment"]["FLYWHEEL_GATEWAY_SPOOL"].startswith("/var/lib/flywheel/")
    (device,) = gpu_gateway["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    gateway = SERVICES["gateway"]["environment"]
    assert {"FLYWHEEL_GATEWAY_KEYS", "FLYWHEEL_GATEWAY_UPSTREAM"} <= set(gateway)
    assert "flywheel-home:/var/lib/flywheel" in SERVICES["gateway"]["volumes"]  # the spool outlives the container
    assert SERVICES["dask-worker"]["deploy"]["replicas"] == 2
    gpu = SERVICES["gpu-worker"]
    assert gpu["profiles"] == ["gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    init = " ".join(SERVICES["minio-init"]["command"])
    assert "notify_webhook:flywheel endpoint=http://webhook:8000/hooks/s3-events" in init
    assert "arn:minio:sqs::flywheel:webhook --event put --prefix landing/" in init


def test_the_fixed_vllm_server_keeps_idle_connections_as_long_as_flywheels_servers():
    # vLLM's default (5 s) is uvicorn's: a request sent on an idle connection just as the
    # server closes it is reset (flows/http_server.py)
    from flows.http_server import KEEP_ALIVE_S

    assert SERVICES["vllm"]["environment"]["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == str(KEEP_ALIVE_S)


def test_the_workers_track_to_the_mlflow_service():
    # the flows (cycle, evaluate) run in the worker pools: their report tasks write the runs
    argv = SERVICES["mlflow"]["command"]
    port = argv[argv.index("--port") + 1]
    for name in ("cpu-worker", "gpu-worker"):
        assert SERVICES[name]["environment"]["MLFLOW_TRACKING_URI"] == f"http://mlflow:{port}", name
    assert f"mlflow:{port}" in env_example()["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    assert "mlflow-data:/var/lib/mlflow" in SERVICES["mlflow"]["volumes"]


def test_every_variable_is_in_env_example_and_every_example_is_used():
    text = (ROOT / "docker-compose.yml").read_text()
    used = set(_VAR.findall(text))
    example = env_example()
    assert used - set(example) == set(), "variables missing from .env.example"
    assert set(example) - used == set(), ".env.example entries no service reads"


def test_secrets_come_from_env_not_from_the_compose_file():
    for name, svc in SERVICES.items():
        for key, value in (svc.get("environment") or {}).items():
            if re.search(r"PASSWORD|SECRET|TOKEN|KEYS", key):
                assert _VAR.search(str(value)), f"{name}: {key} is hard-coded"


def test_volumes_dependencies_and_health_checks_are_consistent():
    declared = set(COMPOSE.get("volumes") or {})
    for name, svc in SERVICES.items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name}: bind mount {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
        for target in svc.get("depends_on", {}):
            assert target in SERVICES, f"{name} depends on unknown {target}"
            condition = svc["depends_on"][target]["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[target], f"{name} waits for {target}, which has no health check"
        if name not in ONE_SHOT:
            assert "healthcheck" in svc, f"{name} runs for long and has no health check"


def _health_port(svc: dict) -> int | None:
    found = re.search(r"127\.0\.0\.1:(\d+)/", " ".join(svc["healthcheck"]["test"]))
    return int(found.group(1)) if found else None


@pytest.mark.parametrize("name", sorted(n for n, s in SERVICES.items() if s.get("image") in OUR_IMAGES))
def test_health_checks_probe_the_port_the_command_serves(name):
    svc = SERVICES[name]
    command = " ".join(svc["command"])
    port = _health_port(svc)
    assert port is not None, f"{name}: health check probes no HTTP port"
    if "-healthcheck" in command:  # Prefect workers serve /health on PREFECT_WORKER_WEBSERVER_PORT (8080)
        assert port == 8080 and svc["environment"]["PREFECT_WORKER_WEBSERVER_HOST"] == "0.0.0.0"
    else:
        assert f":{port}" in command or f" {port}" in command, f"{name}: probes {port}, command serves elsewhere"


def _command_paths() -> dict[tuple[str, ...], set[str]]:
    """Per command path (e.g. ('dask', 'worker')), every option the compose file passes it."""
    paths: dict[tuple[str, ...], set[str]] = {}
    for svc in SERVICES.values():
        if svc.get("image") not in OUR_IMAGES:
            continue
        argv = svc["command"]
        if argv[:2] == ["python", "-m"]:  # a module's command line: `python -m vllm.entrypoints...`
            paths.setdefault(tuple(argv[:3]), set()).update(w for w in argv if w.startswith("--"))
            continue
        words = tuple(w for w in argv if not w.startswith("-") and "/" not in w and ":" not in w
                      and not w.isdigit() and not w.replace(".", "").isdigit())
        words = words[:3] if words[:2] in {("prefect", "server"), ("prefect", "worker")} else words[:2]
        paths.setdefault(words, set()).update(w for w in argv if w.startswith("--"))
    return paths


def _help(path: tuple[str, ...]) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250", "TERM": "dumb", "NO_COLOR": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.run([str(BIN / path[0]), *path[1:], "--help"], capture_output=True, text=True,
                          timeout=180, env=env, cwd=ROOT)


def test_every_service_command_is_a_real_command_with_real_options():
    paths = _command_paths()
    assert {p[0] for p in paths} <= {"flywheel", "prefect", "dask", "mlflow", "python"}
    assert ("flywheel", "serve") in paths and ("flywheel", "webhook") in paths
    with ThreadPoolExecutor(3) as pool:
        helps = dict(zip(paths, pool.map(_help, paths)))
    for path, options in paths.items():
        done = helps[path]
        assert done.returncode == 0, f"{shlex.join(path)} --help failed: {done.stderr[-1000:]}"
        for option in options:
            assert option in done.stdout, f"{shlex.join(path)} has no option {option}"


def test_images_build_what_the_services_need():
    cpu = (ROOT / "docker" / "Dockerfile").read_text()
    gpu = (ROOT / "docker" / "Dockerfile.gpu").read_text()
    assert cpu.startswith("# ") and "FROM python:3.11-slim" in cpu and "bubblewrap" in cpu
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in cpu and '".[cpu]"' in cpu
    assert "FROM nvidia/cuda:" in gpu and '".[gpu]"' in gpu and "deepspeed" in gpu
    for svc in SERVICES.values():
        if "build" in svc:
            assert (ROOT / svc["build"]["context"] / svc["build"]["dockerfile"]).exists()
    for copied in re.findall(r"^COPY (\S+)/ ", cpu, flags=re.M):
        assert (ROOT / copied / "__init__.py").exists(), f"Dockerfile copies {copied}, not a package"
    # `pip install .` compiles the native extensions: a compiler and their libraries' headers
    extensions = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"]
    assert {lib for ext in extensions for lib in ext.get("libraries", [])} == {"crypto"}
    for image in (cpu, gpu):
        assert re.search(r"\b(gcc|build-essential)\b", image) and "libssl-dev" in image
    for ext in extensions:
        for source in ext["sources"] + ext.get("depends", []):
            assert source.startswith(tuple(f"{copied}/" for copied in re.findall(r"^COPY (\S+)/ ", cpu, flags=re.M)))
