"""Process entry point for vLLM generation: `python -m trainer.vllm_worker JOB OUT`.

JOB is JSON written by `trainer.engine.generate_vllm_each`: runs of (model folder,
tokenised prompts) and the EngineConfig fields. Run i's samples go to OUT.i, one JSON
line per sample (fields of `trainer.engine.Sample`). Running vLLM here, behind the
`__main__` guard, is what lets its engine spawn worker processes safely and keeps its
start-up out of the caller. The runs share this process, so importing vLLM and
warming its kernels is paid once (an evaluation samples candidate and production
here: ~8 s of a ~20 s call on 2 cores); each run gets its own engine, freed before
the next one starts. Timings per run (start-up, generation, tokens/s) go to
OUT.timing.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def run_job(job_path: Path, out_path: Path) -> list[dict]:
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    job = json.loads(job_path.read_text())
    timings = []
    for index, run in enumerate(job["runs"]):
        if index:
            cleanup_dist_env_and_memory()  # the previous engine's process group and memory
        timings.append(run_one(run, job["config"], Path(f"{out_path}.{index}")))
    return timings


def run_one(run: dict, cfg: dict, out_path: Path) -> dict:
    """One model's prompts; the run carries what the model decides (context, dtype, stop
    tokens, each prompt's completion budget), the config the rest."""
    from vllm import LLM, SamplingParams

    prompt_token_ids = run["prompt_token_ids"]
    t0 = time.perf_counter()
    llm = LLM(model=run["model_dir"], dtype=run["dtype"], max_model_len=run["max_model_len"],
              enforce_eager=True, gpu_memory_utilization=cfg["gpu_memory_utilization"],
              # The engine-wide seed makes a run repeatable. No per-request seed: on CPU
              # it crashes vLLM 0.32 once prefill is chunked ("CPU Generator does not use
              # offset"), which any batch above max_num_batched_tokens triggers.
              seed=cfg["seed"], logprobs_mode="processed_logprobs")
    t1 = time.perf_counter()
    params = [SamplingParams(n=cfg["n"], temperature=cfg["temperature"], max_tokens=budget, logprobs=0,
                             stop_token_ids=run["stop_token_ids"]) for budget in run["max_tokens"]]
    prompts = [{"prompt_token_ids": ids} for ids in prompt_token_ids]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    t2 = time.perf_counter()
    n_tokens = write_samples(outputs, prompt_token_ids, out_path)
    return {"startup_s": t1 - t0, "generate_s": t2 - t1, "completion_tokens": n_tokens,
            "tokens_per_s": n_tokens / max(t2 - t1, 1e-9)}


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


if __name__ == "__main__":
    timing = run_job(Path(sys.argv[1]), Path(sys.argv[2]))
    Path(sys.argv[2] + ".timing.json").write_text(json.dumps(timing))
