"""Process entry point for vLLM generation, cold or warm.

Cold: `python -m trainer.vllm_worker JOB OUT`. JOB is JSON written by
`trainer.engine.job_request`: runs of (model folder, tokenised prompts) and the
EngineConfig fields. Run i's samples go to OUT.i, one JSON line per sample (fields of
`trainer.engine.Sample`); timings per run (start-up, generation, tokens/s) to
OUT.timing.json. The runs share this process, so importing vLLM and warming its
kernels is paid once (an evaluation samples candidate and production here: ~8 s of a
~20 s call on 2 cores); each run gets its own engine, freed before the next starts.

Warm: `python -m trainer.vllm_worker --serve REQUEST_FD REPLY_FD`, started by
`trainer.warm_engine.WarmEngine`. Each line read from REQUEST_FD names a JOB and an
OUT as above; the worker answers one JSON line on REPLY_FD ({"ok": true} or the
error). One `LLM` lives across requests: a run whose model has the loaded one's
architecture gets its weights loaded in place (`reload_in_place`), any other change
rebuilds the engine. Each run's timing says which (`engine`: started, reloaded,
rebuilt or reused). The owner holds the request pipe's write end: when it closes or
dies, end of file makes this process exit at once, even mid-generation, so a worker
never outlives its owner. After a failed request the worker exits rather than serve
from an engine in an unknown state; the owner starts a new one on its next request.

Running vLLM here, behind the `__main__` guard, is what lets its engine spawn worker
processes safely and keeps its start-up out of the caller.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import queue
import sys
import threading
import time
import traceback
from pathlib import Path

# config.json fields that say nothing about the network vLLM builds: a policy exported
# by training may differ from its parent in these (dtype, library version) and still
# takes its parent's engine. Any other difference rebuilds (safe, and slow).
_NOT_ARCHITECTURE = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache",
                     "bos_token_id", "eos_token_id", "pad_token_id"}
# The engine detokenises with the tokenizer it was built with, so that is part of the shape too.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model")


def run_job(job_path: Path, out_path: Path) -> list[dict]:
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    job = json.loads(job_path.read_text())
    timings = []
    for index, run in enumerate(job["runs"]):
        if index:
            cleanup_dist_env_and_memory()  # the previous engine's process group and memory
        t0 = time.perf_counter()
        llm = build_llm(run, job["config"])
        timing = generate_run(llm, run, job["config"], Path(f"{out_path}.{index}"))
        timings.append({"engine": "started", "startup_s": timing.pop("generate_start") - t0, **timing})
        del llm
    return timings


def build_llm(run: dict, cfg: dict):
    """A new engine for `run`'s model. The run carries what the model decides (context,
    dtype, stop tokens, each prompt's completion budget), the config the rest."""
    from vllm import LLM

    return LLM(model=run["model_dir"], dtype=run["dtype"], max_model_len=run["max_model_len"],
               enforce_eager=True, gpu_memory_utilization=cfg["gpu_memory_utilization"],
               # The engine-wide seed makes a run repeatable. No per-request seed: on CPU
               # it crashes vLLM 0.32 once prefill is chunked ("CPU Generator does not use
               # offset"), which any batch above max_num_batched_tokens triggers.
               seed=cfg["seed"], logprobs_mode="processed_logprobs")


def generate_run(llm, run: dict, cfg: dict, out_path: Path) -> dict:
    """Sample `run`'s prompts and write them to out_path; its timings."""
    from vllm import SamplingParams

    t1 = time.perf_counter()
    # A fresh engine leaves the RNGs exactly where seeding put them (checked on 0.32), so
    # seeding again here is a no-op for it and makes a reused engine sample what a fresh
    # one would. The CPU sampler draws from the global torch generator.
    llm.collective_rpc(_seed_worker, args=(cfg["seed"],))
    params = [SamplingParams(n=cfg["n"], temperature=cfg["temperature"], max_tokens=budget, logprobs=0,
                             stop_token_ids=run["stop_token_ids"]) for budget in run["max_tokens"]]
    prompt_token_ids = run["prompt_token_ids"]
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_token_ids], params, use_tqdm=False)
    t2 = time.perf_counter()
    n_tokens = write_samples(outputs, prompt_token_ids, out_path)
    return {"generate_start": t1, "generate_s": t2 - t1, "completion_tokens": n_tokens,
            "tokens_per_s": n_tokens / max(t2 - t1, 1e-9)}


def _seed_worker(worker, seed: int) -> None:
    from vllm.utils.torch_utils import set_random_seed

    set_random_seed(seed)


def write_samples(outputs, prompt_token_ids: list[list[int]], out_path: Path) -> int:
    n_tokens = 0
    with out_path.open("w") as f:
        for p_idx, request in enumerate(outputs):
            for s_idx, comp in enumerate(sorted(request.outputs, key=lambda c: c.index)):
                ids = list(comp.token_ids)
                # logprobs=0 returns the sampled token's own logprob at each position.
                logps = [step[tok].logprob for tok, step in zip(ids, comp.logprobs)]
                n_tokens += len(ids)
                f.write(json.dumps({
                    "prompt_idx": p_idx, "sample_idx": s_idx, "prompt_token_ids": prompt_token_ids[p_idx],
                    "text": comp.text, "token_ids": ids, "logprobs": logps,
                    "finish_reason": comp.finish_reason}) + "\n")
    return n_tokens


def architecture(model_dir: str | Path) -> str:
    """What an engine built for this folder is, beyond its weights: the network (config.json
    less `_NOT_ARCHITECTURE`) and the tokenizer. Folders of equal architecture can share an
    engine, each loaded into it in place (here, and in the gateway's servers)."""
    folder = Path(model_dir)
    config = {k: v for k, v in json.loads((folder / "config.json").read_text()).items()
              if k not in _NOT_ARCHITECTURE}
    tokenizer = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
                 for name in _TOKENIZER_FILES if (folder / name).is_file()}
    return json.dumps([config, tokenizer], sort_keys=True)


def engine_shape(run: dict, cfg: dict) -> str:
    """What an engine is built for, beyond its weights: equal shapes take a reload."""
    engine = {"dtype": run["dtype"], "max_model_len": run["max_model_len"],
              "gpu_memory_utilization": cfg["gpu_memory_utilization"],
              "cpu_kv_cache_gib": cfg["cpu_kv_cache_gib"]}
    return json.dumps([json.loads(architecture(run["model_dir"])), engine], sort_keys=True)


def weights_identity(model_dir: str) -> list:
    """The folder and its weight files' sizes and times: a folder rewritten in place reloads."""
    folder = Path(model_dir)
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin"))
    return [str(folder.resolve())] + [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def reload_in_place(llm, model_dir: str) -> None:
    """Load `model_dir`'s weights into the running engine (same architecture)."""
    llm.collective_rpc("reload_weights", kwargs={"weights_path": model_dir})
    llm.collective_rpc(refresh_cpu_gemm)
    # Cached prefixes hold keys and values computed by the old weights.
    llm.reset_prefix_cache()


def refresh_cpu_gemm(worker) -> int:
    """Rebuild CPU matmul handles that point at the reload's scratch copy of a weight.

    vLLM 0.32's in-place reload processes each layer on a temporary copy and then copies
    values back into the live parameters. A linear layer's oneDNN handle is rebuilt from
    that copy and owns its packed weight, but the (tied) embedding and lm_head keep their
    weight and read it through a handle made from the temporary, freed, copy: measured
    on the tiny model, logprobs after a reload were off by 0.84 until these handles are
    rebuilt on the live weight. GPU workers have no such handles (nothing to do).
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    refreshed = 0
    for module in worker.model_runner.get_model().modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and weight is not None and weight.ndim == 2 and weight.numel():
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            refreshed += 1
    return refreshed


class InPlaceReload:
    """vLLM worker extension (`--worker-extension-cls trainer.vllm_worker.InPlaceReload`) for
    the servers the gateway starts: their API server runs the engine in another process, where
    a collective call must be named, not passed as a function. The same steps as
    `reload_in_place`, less the prefix cache (the API server resets that)."""

    def flywheel_reload(self, weights_path: str) -> int:
        self.reload_weights(weights_path=weights_path)
        return refresh_cpu_gemm(self)


class Server:
    """One engine kept across requests (the warm mode)."""

    def __init__(self) -> None:
        self.llm = None
        self.shape: str | None = None
        self.weights: list | None = None
        # Set in the owner's environment, it wins over the configs (as for a cold worker).
        self.user_kv_cache = os.environ.get("VLLM_CPU_KVCACHE_SPACE")

    def run_job(self, job_path: Path, out_path: Path) -> list[dict]:
        job = json.loads(job_path.read_text())
        timings = []
        for index, run in enumerate(job["runs"]):
            t0 = time.perf_counter()
            action = self.load(run, job["config"])
            timing = generate_run(self.llm, run, job["config"], Path(f"{out_path}.{index}"))
            timings.append({"engine": action, "startup_s": timing.pop("generate_start") - t0, **timing})
        return timings

    def load(self, run: dict, cfg: dict) -> str:
        """Make the engine serve `run`'s model; say how: started, rebuilt, reloaded, reused."""
        shape, weights = engine_shape(run, cfg), weights_identity(run["model_dir"])
        if self.llm is not None and shape == self.shape:
            if weights == self.weights:
                return "reused"
            reload_in_place(self.llm, run["model_dir"])
            self.weights = weights
            return "reloaded"
        action = "started" if self.llm is None else "rebuilt"
        if self.llm is not None:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            self.llm, self.shape = None, None
            cleanup_dist_env_and_memory()  # the old engine's process group and memory
        # Read by vLLM when the engine is built, so a config's value applies to its engine.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = self.user_kv_cache or str(cfg["cpu_kv_cache_gib"])
        self.llm = build_llm(run, cfg)
        self.shape, self.weights = shape, weights
        return action


def serve(request_fd: int, reply_fd: int) -> None:
    requests: queue.Queue[dict] = queue.Queue()

    def read_requests() -> None:
        with os.fdopen(request_fd, "r") as pipe:
            for line in pipe:
                requests.put(json.loads(line))
        # End of file: the owner closed the engine or died. Exit now, even mid-generation;
        # the operating system frees the engine's memory.
        os._exit(0)

    threading.Thread(target=read_requests, name="requests", daemon=True).start()
    # Import vLLM (16-20 s on 2 cores) before the first request rather than on it: an
    # owner that starts the worker early (a cycle, before ingest and curate) gets that
    # time back. Importing builds nothing; the engine waits for a request's config.
    importlib.import_module("vllm")
    server = Server()
    with os.fdopen(reply_fd, "w") as reply:
        while True:
            request = requests.get()
            try:
                timings = server.run_job(Path(request["job"]), Path(request["out"]))
            except Exception:  # the boundary: the owner gets the error as its answer
                reply.write(json.dumps({"ok": False, "error": traceback.format_exc()}) + "\n")
                reply.flush()
                os._exit(1)
            Path(request["out"] + ".timing.json").write_text(json.dumps(timings))
            reply.write(json.dumps({"ok": True}) + "\n")
            reply.flush()


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), int(sys.argv[3]))
    else:
        timing = run_job(Path(sys.argv[1]), Path(sys.argv[2]))
        Path(sys.argv[2] + ".timing.json").write_text(json.dumps(timing))
