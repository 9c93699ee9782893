"""The Prefect UI as a user sees it: headless Chromium on the deployment page.

Needs Debian's `chromium` (`apt-get install -y chromium`); skipped without it.
"""
from __future__ import annotations

import html
import importlib.util
import re
import shutil
import struct
import subprocess

import httpx
import pytest

from flows.deployments import ScheduleConfig
from tests.flows.prefect_stack import register_in_process

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: apt-get install -y chromium")


def chromium(url: str, profile, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--window-size=1400,900", "--virtual-time-budget=15000", *args, url],
        capture_output=True, text=True, timeout=120)


def test_the_deployment_page_shows_its_name_and_schedule(prefect_server, tmp_path):
    register_in_process(prefect_server, tmp_path, ScheduleConfig(ingest_interval_s=900))
    found = httpx.post(f"{prefect_server.api_url}/deployments/filter",
                       json={"deployments": {"name": {"any_": ["ingest"]}}}).json()
    url = f"{prefect_server.ui_url}/deployments/deployment/{found[0]['id']}"

    dom = chromium(url, tmp_path / "profile", "--dump-dom")
    text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom.stdout)))
    assert "Deployments ingest" in text, text[:2000]
    assert "Every 15 minutes" in text and "Work Pool cpu" in text, text[:2000]
    assert "Can't connect to Server API" not in text

    png = tmp_path / "deployment.png"
    chromium(url, tmp_path / "profile", f"--screenshot={png}")
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", header[16:24]) == (1400, 900)
    assert png.stat().st_size > 30_000  # a rendered page, not a blank frame
    print(f"screenshot: {png}")


@pytest.mark.skipif(importlib.util.find_spec("flows.flywheel") is None, reason="flows/flywheel.py not built yet")
def test_the_cycle_page_shows_its_cron_in_words(prefect_server, tmp_path):
    register_in_process(prefect_server, tmp_path, ScheduleConfig(cycle_cron="30 4 * * 1-5"))
    found = httpx.post(f"{prefect_server.api_url}/deployments/filter",
                       json={"deployments": {"name": {"any_": ["flywheel-cycle"]}}}).json()
    url = f"{prefect_server.ui_url}/deployments/deployment/{found[0]['id']}"
    dom = chromium(url, tmp_path / "profile", "--dump-dom")
    text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom.stdout)))
    assert "Deployments flywheel-cycle" in text and "Work Pool gpu" in text, text[:2000]
    assert "At 04:30 AM, Monday through Friday" in text, text[:3000]
    png = tmp_path / "cycle.png"
    chromium(url, tmp_path / "profile", f"--screenshot={png}")
    print(f"screenshot: {png}")
