"""Demo evaluation sets: items from the same generators as the logs, kept apart by a `Guard`.

About a third of the items open with a preamble sentence ("Please answer carefully."),
so a planted leak can move it; a few give the prompt as chat messages.
"""
import random

from flows.demo.data.domains import DEFAULT_VERIFIERS, sample_task
from flows.demo.data.guard import Guard, digest
from flows.demo.data.similarity import words
from flows.demo.data.vocab import PREAMBLES, SYSTEM_PROMPTS

def eval_size(per_domain: int) -> int:
    """Items per domain: `per_domain` if set, else 100.

    Not scaled with the number of logs: every code or JSON item makes the word runs it
    contains unavailable to clean logs, and a large run reuses items for leaks instead.
    """
    return per_domain or 100


def build_evalsets(rng: random.Random, size: int, guard: Guard, chat_share: float = 0.05,
                   preamble_share: float = 0.35) -> list[dict]:
    """`size` distinct items per domain; each keeps its task (for leaks) and its preamble."""
    items, keys, seen, guarded = [], set(), set(), []
    for domain in DEFAULT_VERIFIERS:
        count = 0
        while count < size:
            task = sample_task(domain, rng)
            preamble = rng.choice(PREAMBLES) if rng.random() < preamble_share else None
            text = f"{preamble} {task['prompt']}" if preamble else task["prompt"]
            forms = [words(task["prompt"]), words(text)]
            if task["key"] in keys or any(digest(f) in seen for f in forms):
                continue
            keys.add(task["key"])
            seen.update(digest(f) for f in forms)
            guarded += [(task["key"], f) for f in forms]
            count += 1
            item = {"id": f"{domain}-{count:04d}", "domain": domain, "prompt": text,
                    "reference": task["reference"]}
            if rng.random() < chat_share:
                item["prompt"] = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS[domain])},
                                  {"role": "user", "content": text}]
            if rng.random() < 0.2:
                item["verifier"] = DEFAULT_VERIFIERS[domain]
            items.append({"item": item, "task": task, "preamble": preamble, "text": text})
    guard.add_eval(guarded)
    return items
