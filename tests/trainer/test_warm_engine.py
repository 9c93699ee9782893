"""The warm engine: one vLLM worker across calls, each new policy's weights loaded in place.

Tiny model: three engine builds (warm start, one rebuild, one cold reference); SmolLM2:
two more. ~90 s in all on 2 idle cores.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.demo.tiny_model import ModelConfig, init_model
from tests.trainer.conftest import addition_prompt, score_tokens
from tests.trainer.test_engine import check_samples
from trainer import warm_engine
from trainer.engine import EngineConfig, generate, generate_vllm
from trainer.warm_engine import WarmEngine, shared_engine

PROMPTS = [addition_prompt(12, 34), addition_prompt(56, 7), [{"role": "user", "content": "Say hi\n  twice"}]]
CFG = EngineConfig(n=3, max_tokens=8, temperature=1.0, seed=5)
ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def models(tiny_model, tmp_path_factory):
    """a and b: two weight sets of one architecture; deep: another architecture."""
    folder = tmp_path_factory.mktemp("warm")
    return {"a": tiny_model, "b": init_model(folder / "b", ModelConfig(seed=3)),
            "deep": init_model(folder / "deep", ModelConfig(num_hidden_layers=2, seed=1))}


@pytest.fixture(scope="module")
def warm_calls(models):
    """a, b, a, a (through `generate` and the shared engine), deep: one engine's answers."""
    calls = []
    with shared_engine() as engine:
        for name in ("a", "b", "a", "a", "deep"):
            if len(calls) == 3:
                samples = generate(models[name], PROMPTS, CFG)  # no engine given: the shared one
            else:
                samples = engine.generate_each([(models[name], PROMPTS)], CFG)[0][0]
            calls.append({"model": name, "samples": samples, "pid": engine.pid,
                          "engine": engine.last_timings[0]["engine"]})
    return calls


@pytest.mark.slow
def test_one_worker_serves_every_call_and_reloads_weights_in_place(warm_calls):
    assert [c["engine"] for c in warm_calls] == ["started", "reloaded", "reloaded", "reused", "rebuilt"]
    assert len({c["pid"] for c in warm_calls}) == 1
    for call in warm_calls:
        check_samples(call["samples"], CFG)


@pytest.mark.slow
def test_reloaded_engine_samples_what_a_fresh_engine_samples(warm_calls, models):
    a, b, a_again, a_reused, _ = (c["samples"] for c in warm_calls)
    fresh, timing = generate_vllm(models["b"], PROMPTS, CFG)
    assert timing["engine"] == "started"
    assert [s.token_ids for s in a] != [s.token_ids for s in b]  # really other weights
    # Same seed, same weights: a fresh engine and a reloaded one draw the same tokens.
    worst = {}
    for name, reloaded, reference in (("b", b, fresh), ("a again", a_again, a), ("a reused", a_reused, a)):
        assert [s.token_ids for s in reloaded] == [s.token_ids for s in reference], name
        worst[name] = max(abs(x - y) for r, f in zip(reloaded, reference, strict=True)
                          for x, y in zip(r.logprobs, f.logprobs, strict=True))
    print(f"max |logprob| difference to a fresh engine on the same weights: {worst}")
    # Absolute: logprobs near 0 make relative error meaningless. Measured: 0.0 (fp32 on CPU).
    assert max(worst.values()) < 1e-5


@pytest.mark.slow
def test_architecture_change_rebuilds_the_engine_on_the_new_model(warm_calls, models):
    deep = warm_calls[-1]
    assert deep["engine"] == "rebuilt"
    worst = max(abs(x - y) for s in deep["samples"]
                for x, y in zip(score_tokens(models["deep"], s.prompt_token_ids, s.token_ids), s.logprobs))
    assert worst < 1e-4  # the transformers reference on the deep model's own weights


def test_warm_is_a_switch():
    with pytest.raises(ValueError, match="warm must be true or false"):
        EngineConfig(warm=1)


def worker_gone(pid: int) -> bool:
    """Exited (a zombie waiting for its new parent to reap it counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pid: int, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while not worker_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return worker_gone(pid)


def test_worker_exits_when_its_owner_closes_it_even_on_error():
    with pytest.raises(RuntimeError, match="stage failed"):
        with shared_engine() as engine:
            pid = engine.start()
            assert warm_engine.shared() is engine and not worker_gone(pid)
            raise RuntimeError("stage failed")
    assert warm_engine.shared() is None
    assert wait_gone(pid)


def test_worker_exits_when_its_owner_is_killed():
    owner = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom trainer.warm_engine import WarmEngine\n"
         "print(WarmEngine().start(), flush=True)\ntime.sleep(600)"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        pid = int(owner.stdout.readline())
        assert not worker_gone(pid)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert wait_gone(pid), f"the worker {pid} outlived its owner"
    finally:
        owner.kill()
        owner.wait()


def perturbed_copy(src: Path, dst: Path, scale: float = 0.02) -> Path:
    """src with every weight moved by scale x its spread: a trained policy's stand-in."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    generator = torch.Generator().manual_seed(0)
    for path in dst.glob("*.safetensors"):
        tensors = load_file(path)
        save_file({k: t + scale * t.std() * torch.randn(t.shape, generator=generator) for k, t in tensors.items()},
                  path, metadata={"format": "pt"})
    return dst


@pytest.mark.slow
def test_reload_on_a_real_model_samples_what_a_fresh_engine_samples(smollm2, tmp_path):
    """SmolLM2-135M: real sizes take other CPU kernels than the tiny model's."""
    policy = perturbed_copy(smollm2, tmp_path / "policy")
    cfg = EngineConfig(n=2, max_tokens=16, temperature=0.7, seed=3)
    prompts = [[{"role": "user", "content": "What is 17 + 25?"}], [{"role": "user", "content": "Name a colour."}]]
    with WarmEngine() as engine:
        before = engine.generate_each([(smollm2, prompts)], cfg)[0][0]
        (after,), (timing,) = engine.generate_each([(policy, prompts)], cfg)
    fresh, _ = generate_vllm(policy, prompts, cfg)
    assert timing["engine"] == "reloaded"
    assert [s.token_ids for s in before] != [s.token_ids for s in after]
    assert [s.token_ids for s in after] == [s.token_ids for s in fresh]
    worst = max(abs(x - y) for a, f in zip(after, fresh) for x, y in zip(a.logprobs, f.logprobs, strict=True))
    print(f"SmolLM2: max |logprob| difference, reloaded vs fresh: {worst:.2e}")
    assert worst < 1e-5
