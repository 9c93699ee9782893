"""Simulated production for the demo: the production model answers real traffic.

Each request is a task drawn from the demo domains; the production model answers it
once through the generation engine, the verifier scores the answer, and every
failed request becomes a failure log in the OpenAI chat format — exactly what a
serving stack would log. The stream also carries what real logs carry: the same
question asked again, lightly edited copies, evaluation items that users pasted in
(reformatted), and broken lines. Nothing here is scored by hand: failure is what the
verifier says, so the failure rate measures the model.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

from flows.demo.data.domains import DOMAINS, sample_task
from flows.demo.data.planting import MALFORMED_KINDS, REFORMAT_KINDS, malformed_line, near_duplicate, reformat
from tasks.round.scoring import score_rows
from trainer.engine import EngineConfig, generate, prompt_fits
from verifiers.registry import VerifierConfig
from verifiers.verdict import Verdict


@dataclass(frozen=True)
class TrafficConfig:
    requests: int = 400
    math_share: float = 0.9
    """The tiny demo policy can only learn arithmetic; other domains keep the pipeline honest."""
    addition_share: float = 0.7
    """Of the math requests, the share asking for a sum of two numbers: the skill a ~1M
    parameter policy learns in minutes. Word problems and expressions stay in the mix."""
    backend: Literal["vllm", "transformers"] = "vllm"
    temperature: float = 0.3
    max_tokens: int = 12
    # A function or a JSON object needs more room than a sum: budgets per domain.
    max_tokens_by_domain: dict[str, int] = field(default_factory=dict)
    repeat_share: float = 0.05
    near_duplicate_share: float = 0.05
    leak_share: float = 0.03
    malformed_share: float = 0.02

    def __post_init__(self) -> None:
        if self.requests < 10:
            raise ValueError("requests must be >= 10 for a failure rate worth reporting")
        shares = (self.repeat_share, self.near_duplicate_share, self.leak_share, self.malformed_share)
        if not 0 <= self.math_share <= 1 or not 0 <= self.addition_share <= 1 \
                or any(not 0 <= s < 0.5 for s in shares):
            raise ValueError("shares are fractions in [0, 1) (planted ones below 0.5)")


@dataclass(frozen=True)
class TrafficResult:
    requests: int
    failures: int
    logs: list[dict]
    lines: list[str]
    """Landing-file lines: failure logs plus the planted repeats, leaks and broken lines."""
    by_domain: dict[str, tuple[int, int]] = field(default_factory=dict)
    """domain -> (requests, failures): the model may fail each domain at its own rate."""

    @property
    def failure_rate(self) -> float:
        return self.failures / self.requests

    def interval(self, z: float = 1.96) -> tuple[float, float]:
        """Wilson 95% interval of the failure rate."""
        return wilson_interval(self.failures, self.requests, z)

    def domain_rates(self) -> dict[str, dict]:
        """Per domain: requests, failures and the failure rate's Wilson 95% interval."""
        return {domain: {"requests": n, "failures": failed, "interval": wilson_interval(failed, n)}
                for domain, (n, failed) in self.by_domain.items() if n}


def wilson_interval(failures: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson interval of a rate `failures / n` (n > 0): honest at small n and near 0 or 1,
    where a domain's few requests put it."""
    p = failures / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # At p = 0 or 1 the bound is exactly 0 or 1; rounding would leave p outside it.
    return (0.0 if p == 0 else max(0.0, centre - half)), (1.0 if p == 1 else min(1.0, centre + half))


def serve_traffic(model_dir: Path, policy_version: str, cfg: TrafficConfig, seed: int,
                  verifiers: VerifierConfig, eval_items: list[dict]) -> TrafficResult:
    """Answer `cfg.requests` fresh tasks with the model; log the failures."""
    rng = random.Random(f"flywheel-traffic:{seed}")
    engine = EngineConfig(backend=cfg.backend, n=1, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                          max_tokens_by_domain=cfg.max_tokens_by_domain, seed=seed)
    tasks: list[dict] = []
    while len(tasks) < cfg.requests:  # requests the model's context can hold
        drawn = [draw_request(cfg, rng) for _ in range(cfg.requests - len(tasks))]
        fits = prompt_fits(model_dir, [[{"role": "user", "content": t["prompt"]}] for t in drawn], engine,
                           [t["domain"] for t in drawn])
        tasks += [t for t, ok in zip(drawn, fits, strict=True) if ok]
    prompts = [[{"role": "user", "content": t["prompt"]}] for t in tasks]
    samples = generate(model_dir, prompts, engine, [t["domain"] for t in tasks])
    rows = [{"verifier": verifiers.verifier_for(t["domain"]), "spec": t["reference"], "prompt": t["prompt"],
             "completion": s.text} for t, s in zip(tasks, samples, strict=True)]
    # Scored as the pipeline scores: code in the sandbox on the warm Dask workers.
    verdicts = [Verdict.from_dict(row) for row in score_rows(rows, verifiers)]
    started = datetime(2026, 12, 1, tzinfo=timezone.utc) + timedelta(days=seed)
    logs = [_failure_log(t, s.text, v, policy_version, started + timedelta(seconds=i), rng)
            for i, (t, s, v) in enumerate(zip(tasks, samples, verdicts, strict=True)) if not v.passed]
    by_domain = {domain: (sum(t["domain"] == domain for t in tasks), sum(log["domain"] == domain for log in logs))
                 for domain in DOMAINS}
    return TrafficResult(cfg.requests, len(logs), logs, _landing_lines(logs, cfg, rng, eval_items, started),
                         by_domain)


def draw_request(cfg: TrafficConfig, rng: random.Random) -> dict:
    """One production request: a task of the traffic's domain and math mix."""
    if rng.random() >= cfg.math_share:
        return sample_task(rng.choice(("code", "json")), rng)
    want_sum = rng.random() < cfg.addition_share
    while True:  # math tasks are drawn until the kind matches: cheap, and keeps the sampler's phrasings
        task = sample_task("math", rng)
        if (task["key"][0] == "add") == want_sum:
            return task


def _failure_log(task: dict, answer: str, verdict, policy_version: str, ts: datetime,
                 rng: random.Random) -> dict:
    return {"id": f"req-{rng.getrandbits(64):016x}", "ts": ts.isoformat().replace("+00:00", "Z"),
            "model": policy_version, "domain": task["domain"],
            "messages": [{"role": "user", "content": task["prompt"]}], "response": answer,
            "failure": {"kind": verdict.status, "detail": verdict.detail[:200]},
            "reference": task["reference"], "meta": {"tenant": rng.choice(("acme", "globex", "initech"))}}


def _landing_lines(logs: list[dict], cfg: TrafficConfig, rng: random.Random, eval_items: list[dict],
                   ts: datetime) -> list[str]:
    """The failure logs plus the repeats, near copies, leaks and broken lines real traffic has."""
    lines = [json.dumps(log) for log in logs]
    if not logs:
        return lines
    count = len(logs)
    for _ in range(round(count * cfg.repeat_share)):
        lines.append(json.dumps({**rng.choice(logs), "id": f"req-{rng.getrandbits(64):016x}"}))
    for _ in range(round(count * cfg.near_duplicate_share)):
        source = rng.choice(logs)
        messages, _edit = near_duplicate(source["messages"], rng)
        lines.append(json.dumps({**source, "messages": messages, "id": f"req-{rng.getrandbits(64):016x}"}))
    for item in rng.sample(eval_items, min(len(eval_items), round(count * cfg.leak_share))):
        text, _kinds = reformat(rng.choice(REFORMAT_KINDS), item["prompt"], None, rng)
        lines.append(json.dumps({**rng.choice(logs), "id": f"req-{rng.getrandbits(64):016x}", "domain": item["domain"],
                                 "messages": [{"role": "user", "content": text}], "reference": item["reference"]}))
    for _ in range(round(count * cfg.malformed_share)):
        lines.append(malformed_line(rng.choice(MALFORMED_KINDS), rng.choice(logs), rng))
    rng.shuffle(lines)
    return lines


def write_landing(lines: list[str], folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path
