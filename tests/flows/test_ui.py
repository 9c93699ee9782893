"""The Prefect UI as a user sees it: headless Chromium on the deployment pages and on
the artifacts of the cycle tests/flows/test_stack.py drove through the webhook.

Needs Debian's `chromium` (`apt-get install -y chromium`); skipped without it.
"""
from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess

import httpx

from flows.deployments import ScheduleConfig
from tests.flows.prefect_stack import register_in_process

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(url: str, profile, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--window-size=1400,900", "--virtual-time-budget=15000", *args, url],
        capture_output=True, text=True, timeout=120)


def page_text(url: str, profile) -> str:
    """The page's visible text once its scripts ran, whitespace collapsed."""
    dom = chromium(url, profile, "--dump-dom")
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom.stdout)))


def screenshot(url: str, profile, png) -> None:
    chromium(url, profile, f"--screenshot={png}")
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", header[16:24]) == (1400, 900)
    assert png.stat().st_size > 30_000  # a rendered page, not a blank frame
    print(f"screenshot: {png}")


def test_the_deployment_page_shows_its_name_and_schedule(prefect_server, tmp_path):
    register_in_process(prefect_server, tmp_path, ScheduleConfig(ingest_interval_s=900))
    found = httpx.post(f"{prefect_server.api_url}/deployments/filter",
                       json={"deployments": {"name": {"any_": ["ingest"]}}}).json()
    url = f"{prefect_server.ui_url}/deployments/deployment/{found[0]['id']}"

    text = page_text(url, tmp_path / "profile")
    assert "Deployments ingest" in text, text[:2000]
    assert "Every 15 minutes" in text and "Work Pool cpu" in text, text[:2000]
    assert "Can't connect to Server API" not in text
    screenshot(url, tmp_path / "profile", tmp_path / "deployment.png")


def test_the_cycle_page_shows_its_cron_in_words(prefect_server, tmp_path):
    register_in_process(prefect_server, tmp_path, ScheduleConfig(cycle_cron="30 4 * * 1-5"))
    found = httpx.post(f"{prefect_server.api_url}/deployments/filter",
                       json={"deployments": {"name": {"any_": ["flywheel-cycle"]}}}).json()
    url = f"{prefect_server.ui_url}/deployments/deployment/{found[0]['id']}"
    text = page_text(url, tmp_path / "profile")
    assert "Deployments flywheel-cycle" in text and "Work Pool gpu" in text, text[:2000]
    assert "At 04:30 AM, Monday through Friday" in text, text[:3000]
    screenshot(url, tmp_path / "profile", tmp_path / "cycle.png")


def test_a_completed_cycle_shows_its_artifacts(prefect_server, stack_run, tmp_path):
    """The funnel and evaluation tables the cycle test_stack.py drove through the webhook published."""
    assert stack_run.cycle["state"] == "COMPLETED", stack_run.tails("gpu-worker")
    run_id = stack_run.cycle["flow_run_id"]
    run_name = httpx.get(f"{prefect_server.api_url}/flow_runs/{run_id}", timeout=30).json()["name"]
    artifacts = {a["key"]: a for a in httpx.post(f"{prefect_server.api_url}/artifacts/filter", timeout=30, json={
        "artifacts": {"flow_run_id": {"any_": [run_id]}}}).json()}
    assert {"flywheel-funnel", "flywheel-evaluation", "flywheel-report"} <= set(artifacts)

    funnel = artifacts["flywheel-funnel"]
    url = f"{prefect_server.ui_url}/artifacts/artifact/{funnel['id']}"
    text = page_text(url, tmp_path / "profile")
    assert "Can't connect to Server API" not in text
    assert f"flywheel-funnel {funnel['id']} cycle {stack_run.cycle['cycle_id']}: rows per stage" in text, text[:3000]
    assert f"Flow Run {run_name}" in text, text[:3000]
    rows = {row["stage"]: row["rows"] for row in json.loads(funnel["data"])}
    assert rows["kept"] > 0 and f"log lines {rows['log lines']} " in text and f"kept {rows['kept']} " in text
    screenshot(url, tmp_path / "profile", tmp_path / "cycle-funnel.png")

    evaluation = artifacts["flywheel-evaluation"]
    text = page_text(f"{prefect_server.ui_url}/artifacts/artifact/{evaluation['id']}", tmp_path / "profile")
    assert "flywheel-evaluation" in text and "pass@1" in text, text[:3000]
    scored = {row["policy_version"] for row in json.loads(evaluation["data"])}
    assert len(scored) == 2 and all(version in text for version in scored), text[:3000]
