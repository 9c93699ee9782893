"""One entry point to the demo task generators: `sample_task(domain, rng)`.

Used by `flywheel demo-data` and, later, to simulate production traffic. A task is a
dict with `domain`, `prompt` (the user's text), `reference` (the verifier spec of
docs/architecture.md), `gold` (a completion that passes the verifier), `response` and `failure`
(a plausible failed answer and how it failed) and `key` (what makes two tasks the same
problem, so evaluation items can be kept apart from training logs).
"""
import random

from flows.demo.data.code import sample_code
from flows.demo.data.json_tasks import sample_json
from flows.demo.data.math_tasks import sample_math
from flows.demo.data.vocab import FOLLOW_UPS, SYSTEM_PROMPTS
from verifiers.registry import DEFAULT_DOMAIN_MAP

DOMAINS = ("math", "code", "json")
DEFAULT_VERIFIERS = DEFAULT_DOMAIN_MAP  # the demo's domains use the verifiers a user's would
_SAMPLERS = {"math": sample_math, "code": sample_code, "json": sample_json}


def sample_task(domain: str, rng: random.Random) -> dict:
    """One task of `domain` drawn from `rng` (the same rng state gives the same task)."""
    if domain not in _SAMPLERS:
        raise ValueError(f"unknown demo domain {domain!r}; choose one of {', '.join(DOMAINS)}")
    return _SAMPLERS[domain](rng)


def sample_domain(rng: random.Random) -> str:
    """Traffic mix of the demo: math is the most common failure, then code, then JSON."""
    return rng.choices(DOMAINS, (0.45, 0.3, 0.25))[0]


def conversation(task: dict, rng: random.Random, system_share: float = 0.1, retry_share: float = 0.06) -> list[dict]:
    """The chat messages a serving stack logged for `task`, up to the failed answer.

    A few conversations carry a system prompt; a few are a retry, where the user already
    rejected one wrong answer and the logged response is the second attempt.
    """
    messages = []
    # A system prompt shared by many users would dominate a short question's shingles and
    # make unrelated short logs look alike, so only longer prompts get one.
    if rng.random() < system_share and len(task["prompt"].split()) >= 12:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS[task["domain"]])})
    messages.append({"role": "user", "content": task["prompt"]})
    if rng.random() < retry_share:
        messages.append({"role": "assistant", "content": task["response"]})
        messages.append({"role": "user", "content": rng.choice(FOLLOW_UPS)})
    return messages
