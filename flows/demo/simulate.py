"""The demo's simulated users: what they ask production, how they judge its answers, and
the repeats, leaks and broken lines that real logs carry besides.

A request is a task drawn from the demo domains, sent as an ordinary chat completion
(flows/demo/production.py sends it through the gateway): the prompt as a user message, a
completion budget per domain, the JSON Schema of a JSON task as its `response_format`.
The users judge each answer with the task's verifier (as the pipeline scores: code in the
sandbox on Dask), say "bad" with a correction built from the task's reference when it
failed and, now and then, "good" when it passed. Nothing here is scored by hand: failure
is what the verifier says, so the failure rate measures the model.

What real logs carry besides is planted in a landing file of its own: a failed question
asked again, lightly edited copies, evaluation items that users pasted in (reformatted),
and broken lines. Not here: the failure logs of served requests, which reach the lake only
through the gateway's logs (tasks/ingest/signals.py).
"""
from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from flows.demo.data.planting import MALFORMED_KINDS, REFORMAT_KINDS, malformed_line, near_duplicate, reformat
from flows.demo.data.domains import sample_task
from tasks.round.scoring import score_rows
from trainer.engine import EngineConfig, prompt_fits
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
    temperature: float = 0.3
    max_tokens: int = 12
    # A function or a JSON object needs more room than a sum: budgets per domain.
    max_tokens_by_domain: dict[str, int] = field(default_factory=dict)
    good_share: float = 0.1
    """Of the answers that passed, the share users mark "good" (a thumbs-up is rarer than a complaint)."""
    repeat_share: float = 0.05
    near_duplicate_share: float = 0.05
    leak_share: float = 0.03
    malformed_share: float = 0.02

    def __post_init__(self) -> None:
        if self.requests < 10:
            raise ValueError("requests must be >= 10 for a failure rate worth reporting")
        shares = (self.repeat_share, self.near_duplicate_share, self.leak_share, self.malformed_share)
        if not 0 <= self.math_share <= 1 or not 0 <= self.addition_share <= 1 or not 0 <= self.good_share <= 1 \
                or any(not 0 <= s < 0.5 for s in shares):
            raise ValueError("shares are fractions in [0, 1) (planted ones below 0.5)")

    def engine(self, model_dir: Path) -> EngineConfig:
        """The sampling settings requests carry, sized to the model's context."""
        return EngineConfig(n=1, temperature=self.temperature, max_tokens=self.max_tokens,
                            max_tokens_by_domain=self.max_tokens_by_domain).for_model(model_dir)


@dataclass(frozen=True)
class TrafficResult:
    requests: int
    failures: int
    """Answers the users judged wrong (the lake's rate also counts the gateway's own signals)."""
    seconds: float
    lines: list[str]
    """The planted landing file's lines: repeats, near copies, leaks and broken lines."""


def wilson_interval(failures: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson interval of a rate `failures / n` (n > 0): honest at small n and near 0 or 1,
    where a domain's few requests put it."""
    p = failures / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # At p = 0 or 1 the bound is exactly 0 or 1; rounding would leave p outside it.
    return (0.0 if p == 0 else max(0.0, centre - half)), (1.0 if p == 1 else min(1.0, centre + half))


def draw_requests(model_dir: Path, cfg: TrafficConfig, rng: random.Random) -> list[dict]:
    """`cfg.requests` tasks whose prompt leaves room for their budget in the model's context."""
    engine, tasks = cfg.engine(model_dir), []
    while len(tasks) < cfg.requests:
        drawn = [draw_request(cfg, rng) for _ in range(cfg.requests - len(tasks))]
        fits = prompt_fits(model_dir, [[{"role": "user", "content": t["prompt"]}] for t in drawn], engine,
                           [t["domain"] for t in drawn])
        tasks += [t for t, ok in zip(drawn, fits, strict=True) if ok]
    return tasks


def draw_request(cfg: TrafficConfig, rng: random.Random) -> dict:
    """One production request: a task of the traffic's domain and math mix."""
    if rng.random() >= cfg.math_share:
        return sample_task(rng.choice(("code", "json")), rng)
    want_sum = rng.random() < cfg.addition_share
    while True:  # math tasks are drawn until the kind matches: cheap, and keeps the sampler's phrasings
        task = sample_task("math", rng)
        if (task["key"][0] == "add") == want_sum:
            return task


def chat_request(task: dict, engine: EngineConfig, tags: dict[str, str]) -> dict:
    """The `chat.completions.create` arguments of one request; `tags` go in its `metadata`.

    No `seed`: vLLM 0.32 on CPU kills its engine when a seeded request's prefill is split
    over two steps (its CPU generator cannot rewind), which 16 requests in flight do.
    """
    request = {"model": "flywheel", "messages": [{"role": "user", "content": task["prompt"]}],
               "temperature": engine.temperature, "max_tokens": engine.budget(task["domain"]),
               "metadata": {"domain": task["domain"], **tags}}
    if task["domain"] == "json":
        request["response_format"] = {"type": "json_schema",
                                      "json_schema": {"name": "answer", "schema": task["reference"]["schema"]}}
    return request


def judge(tasks: list[dict], answers: list[str], verifiers: VerifierConfig) -> list[Verdict]:
    """Each answer scored by its task's verifier, as the pipeline scores (code on Dask)."""
    rows = [{"verifier": verifiers.verifier_for(t["domain"]), "spec": t["reference"], "prompt": t["prompt"],
             "completion": answer} for t, answer in zip(tasks, answers, strict=True)]
    return [Verdict.from_dict(row) for row in score_rows(rows, verifiers)]


def feedback_body(task: dict, completion_id: str, verdict: Verdict, rng: random.Random,
                  good_share: float) -> dict | None:
    """What a user says of an answer (the body of `POST /v1/feedback`), or None: "bad" with
    the right answer for a failure, "good" for `good_share` of the rest."""
    if verdict.passed:
        return {"id": completion_id, "label": "good"} if rng.random() < good_share else None
    correction = CORRECTIONS[task["domain"]](task)
    return {"id": completion_id, "label": "bad", "comment": f"{verdict.status}: {verdict.detail[:100]}",
            **({"correction": correction} if correction else {})}


def _object_correction(task: dict) -> dict | None:
    # The demo's JSON tasks keep their example object as `gold` (JSON text); the gateway's
    # ingest makes {schema of the request, answer: object} the failure log's reference.
    example = task["reference"].get("answer", task.get("gold"))
    example = json.loads(example) if isinstance(example, str) else example
    return {"object": example} if isinstance(example, dict) else None


# domain -> the correction a user sends with "bad" (tasks/ingest/gateway_records.py), made
# from the task's reference, so the failure log ingest derives carries what its verifier needs.
CORRECTIONS: dict[str, Callable[[dict], dict | None]] = {
    "math": lambda task: {"answer": task["reference"]["answer"]},
    "code": lambda task: {k: task["reference"][k] for k in ("tests", "entry_point", "solution")
                          if k in task["reference"]},
    "json": _object_correction,
}


def failure_log(task: dict, answer: str, verdict: Verdict, version: str, ts: datetime,
                rng: random.Random) -> dict:
    """A failed request as a serving stack would log it: what the planted lines copy."""
    return {"id": f"req-{rng.getrandbits(64):016x}", "ts": ts.isoformat().replace("+00:00", "Z"),
            "model": version, "domain": task["domain"],
            "messages": [{"role": "user", "content": task["prompt"]}], "response": answer,
            "failure": {"kind": verdict.status, "detail": verdict.detail[:200]},
            "reference": task["reference"], "meta": {"tenant": rng.choice(("acme", "globex", "initech"))}}


def failed_logs(tasks: list[dict], answers: list[str], verdicts: list[Verdict], version: str,
                rng: random.Random) -> list[dict]:
    """The failure logs of the failed answers, a second apart from now."""
    started = datetime.now(timezone.utc)
    return [failure_log(t, answer, v, version, started + timedelta(seconds=i), rng)
            for i, (t, answer, v) in enumerate(zip(tasks, answers, verdicts, strict=True)) if not v.passed]


def planted_lines(logs: list[dict], cfg: TrafficConfig, rng: random.Random, eval_items: list[dict]) -> list[str]:
    """The repeats, near copies, leaks and broken lines real traffic has beside `logs`, its failures."""
    if not logs:
        return []
    lines, count = [], len(logs)
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
