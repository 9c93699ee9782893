"""The demo's production: one `flywheel gateway` in managed mode, and the clients that call it.

The gateway runs as its own process, as an operator runs it (flows/gateway/): it starts
`vllm serve` of the lake's production model and follows every promotion the demo's cycles
make. The demo's simulated users (flows/demo/simulate.py: what they ask, how they judge)
call it with the `openai` SDK, as an application would, and report wrong answers through
`POST /v1/feedback`. A served request's failure reaches the lake only through the files
the gateway ships and the failure signals ingest derives from them.

Each request carries `metadata` tags (its domain, which serve of the demo sent it); the
gateway logs them with the request and vLLM ignores the field, so the failure rate is read
back from the lake per tag (tasks/ingest/failure_rate.py).

Not here: which requests are sent and whether an answer is right (simulate.py).
"""
from __future__ import annotations

import os
import random
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

from flows.demo.simulate import (TrafficConfig, TrafficResult, chat_request, draw_requests, failed_logs,
                                 feedback_body, judge, planted_lines, wilson_interval)
from flows.gateway.calls import VERSION_HEADER
from flows.gateway.vllm_serve import free_port
from storage.settings import LakeSettings
from tasks.ingest.failure_rate import production_failure_rate
from verifiers.registry import VerifierConfig

CONCURRENCY = 16
"""Requests in flight at once: enough for vLLM to batch, few enough for 2 cores."""


@dataclass(frozen=True)
class Answer:
    completion_id: str
    text: str
    version: str
    """The model version that answered (the gateway's `x-flywheel-model-version`)."""


@dataclass
class DemoGateway:
    url: str
    log_path: Path
    process: subprocess.Popen = field(repr=False)
    key: str = field(repr=False)
    admin_key: str = field(repr=False)

    def client(self) -> openai.OpenAI:
        # One client for every thread: its connection pool is thread-safe.
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=2, timeout=600)

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).raise_for_status().json()

    def wait_for(self, version: str, timeout_s: float = 900) -> float:
        """Seconds until `version` serves: after a promotion the gateway's watch starts its
        `vllm serve` (~45 s on 2 cores) and switches once it answers."""
        started = time.monotonic()
        while self.health()["primary"] != version:
            self.check_alive()
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"the gateway did not switch to {version} in {timeout_s:.0f} s; "
                                   f"its log: {self.log_path}")
            time.sleep(1)
        return time.monotonic() - started

    def flush(self) -> int:
        """Ship every logged call and feedback to the landing now; returns the records shipped."""
        response = httpx.post(f"{self.url}/admin/flush", headers={"Authorization": f"Bearer {self.admin_key}"},
                              timeout=300)
        return response.raise_for_status().json()["shipped"]

    def stop(self, grace_s: float = 120) -> None:
        """A graceful stop: the gateway ships its spool and stops its `vllm serve` before exiting."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def check_alive(self) -> None:
        """Raise, with the gateway's log tail, if it has exited."""
        if self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the gateway exited with {self.process.returncode}; log tail:\n{tail}")


@contextmanager
def running_gateway(settings: LakeSettings, config: Path, max_model_len: int,
                    timeout_s: float = 600) -> Iterator[DemoGateway]:
    """`flywheel gateway` in managed mode on a free port, serving the lake's production
    model, until the block ends; its log is `gateway.log` in the lake's home."""
    port = free_port()
    key, admin_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    env = dict(os.environ, FLYWHEEL_HOME=str(settings.home), FLYWHEEL_CONFIG=str(config),
               FLYWHEEL_GATEWAY_KEYS=key, FLYWHEEL_GATEWAY_ADMIN_KEYS=admin_key,
               # Each look at the lake costs the gateway ~0.3 s of CPU (opening DuckLake), taken
               # from the cycle running beside it: every 2 s was 15% of a core, every 5 s is 6%,
               # and a promoted model's `vllm serve` needs ~45 s to start anyway.
               FLYWHEEL_GATEWAY_WATCH_S="5", FLYWHEEL_GATEWAY_SHIP_MAX_AGE_S="5",
               FLYWHEEL_GATEWAY_SERVE_MAX_MODEL_LEN=str(max_model_len))
    log_path = settings.home / "gateway.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen([sys.executable, "-m", "flows.cli.app", "gateway", "--port", str(port)],
                                   stdout=log_file, stderr=subprocess.STDOUT, env=env)
    gateway = DemoGateway(f"http://127.0.0.1:{port}", log_path, process, key, admin_key)
    try:
        _wait_up(gateway, timeout_s)
        yield gateway
    finally:
        gateway.stop()


def _wait_up(gateway: DemoGateway, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        gateway.check_alive()
        try:
            gateway.health()
            return
        except httpx.HTTPError:  # still starting its first `vllm serve`
            time.sleep(1)
    raise RuntimeError(f"the gateway was not up after {timeout_s:.0f} s; its log: {gateway.log_path}")


def serve_traffic(gateway: DemoGateway, model_dir: Path, version: str, cfg: TrafficConfig, serve: int,
                  verifiers: VerifierConfig, eval_items: list[dict]) -> TrafficResult:
    """One serve: `cfg.requests` requests through the gateway, tagged `serve`; the users'
    feedback; everything shipped to the landing. Returns the lines to plant beside it."""
    rng = random.Random(f"flywheel-traffic:{serve}")
    started = time.perf_counter()
    tasks = draw_requests(model_dir, cfg, rng)
    engine = cfg.engine(model_dir)
    answers = ask(gateway, [chat_request(t, engine, {"serve": str(serve)}) for t in tasks])
    if {a.version for a in answers} != {version}:
        raise RuntimeError(f"serve {serve} expected every answer from {version}, got "
                           f"{sorted({a.version for a in answers})}")
    texts = [a.text for a in answers]
    verdicts = judge(tasks, texts, verifiers)
    said = [feedback_body(t, a.completion_id, v, rng, cfg.good_share)
            for t, a, v in zip(tasks, answers, verdicts, strict=True)]
    tell(gateway, [body for body in said if body is not None])
    gateway.flush()  # this serve's calls and feedback are in the landing before the cycle's ingest
    logs = failed_logs(tasks, texts, verdicts, version, rng)
    return TrafficResult(len(tasks), len(logs), time.perf_counter() - started,
                         planted_lines(logs, cfg, rng, eval_items))


def ask(gateway: DemoGateway, requests: list[dict]) -> list[Answer]:
    """Each request (keyword arguments of `chat.completions.create`) sent through the gateway,
    `CONCURRENCY` at a time; the answers in request order."""
    client = gateway.client()

    def one(request: dict) -> Answer:
        raw = client.chat.completions.with_raw_response.create(**request)
        completion = raw.parse()
        return Answer(completion.id, completion.choices[0].message.content or "", raw.headers[VERSION_HEADER])

    return _each(one, requests)


def tell(gateway: DemoGateway, feedback: list[dict]) -> None:
    """Each feedback body POSTed to /v1/feedback."""
    client = gateway.client()
    _each(lambda body: client.post("/feedback", body=body, cast_to=object), feedback)


def _each(send: Callable, items: list) -> list:
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(send, items))


def measured_rates(settings: LakeSettings, version: str, serve: str) -> dict:
    """What the lake says of one serve: its answered calls, the failure rate with its Wilson
    95% interval, and the same per domain (the requests' `metadata` tags)."""
    tags = {"serve": serve}
    [overall] = production_failure_rate(settings, version, tags=tags)
    domains = sorted(production_failure_rate(settings, version, tags=tags, by_tag="domain"),
                     key=lambda row: -row["calls"])  # the busiest domain first
    by_domain = {row["tag"]: {"requests": row["calls"], "failures": row["failed"],
                              "interval": wilson_interval(row["failed"], row["calls"])} for row in domains}
    return {"requests": overall["calls"], "failure_rate": overall["rate"],
            "interval": wilson_interval(overall["failed"], overall["calls"]), "by_domain": by_domain}
