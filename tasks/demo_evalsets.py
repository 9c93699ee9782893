"""Demo evaluation sets, and the guard that keeps clean demo logs apart from them.

Evaluation items come from the same generators as the logs. A clean log must not be the
same problem as an item (same `key`), repeat an item's words (a shared word 13-gram, or
an item shorter than 13 words appearing whole), or repeat another clean log's words:
otherwise decontamination and dedup would rightly flag it, and the demo manifest would
call a correct decision a false positive.
"""
import hashlib
import random

from tasks.demo_domains import DEFAULT_VERIFIERS, sample_task
from tasks.demo_similarity import words
from tasks.demo_vocab import PREAMBLES, SYSTEM_PROMPTS

NGRAM = 13


def _digest(tokens: list[str]) -> bytes:
    return hashlib.blake2b(" ".join(tokens).encode(), digest_size=8).digest()


class Guard:
    """Remembers what must not be generated again: eval items' keys and words, and every clean prompt."""

    def __init__(self) -> None:
        self.eval_keys: set = set()
        self.eval_ngrams: set[str] = set()
        self.eval_short: dict[str, list[tuple]] = {}
        self.seen: set[bytes] = set()

    def add_eval(self, key: tuple, text: str) -> None:
        tokens = words(text)
        self.eval_keys.add(key)
        self.seen.add(_digest(tokens))
        if len(tokens) < NGRAM:
            self.eval_short.setdefault(tokens[0], []).append(tuple(tokens))
        for i in range(len(tokens) - NGRAM + 1):
            self.eval_ngrams.add(" ".join(tokens[i:i + NGRAM]))

    def admit(self, key: tuple, text: str) -> bool:
        """True (and remembered) if a clean log with this task would be new and uncontaminated."""
        if key in self.eval_keys:
            return False
        tokens = words(text)
        digest = _digest(tokens)
        if digest in self.seen or self._touches_eval(tokens):
            return False
        self.seen.add(digest)
        return True

    def _touches_eval(self, tokens: list[str]) -> bool:
        ngrams = self.eval_ngrams
        if any(" ".join(tokens[i:i + NGRAM]) in ngrams for i in range(len(tokens) - NGRAM + 1)):
            return True
        for i, token in enumerate(tokens):
            for short in self.eval_short.get(token, ()):
                if tuple(tokens[i:i + len(short)]) == short:
                    return True
        return False


def eval_size(logs: int, leak_share: float, per_domain: int) -> int:
    """Items per domain: `per_domain` if set, else 100, growing so leaks rarely reuse an item."""
    if per_domain:
        return per_domain
    return max(100, min(334, round(logs * leak_share / 3)))


def build_evalsets(rng: random.Random, size: int, guard: Guard, chat_share: float = 0.05,
                   preamble_share: float = 0.35) -> list[dict]:
    """`size` distinct items per domain; each keeps its task (for leaks) and its preamble."""
    items = []
    for domain in DEFAULT_VERIFIERS:
        count = 0
        while count < size:
            task = sample_task(domain, rng)
            preamble = rng.choice(PREAMBLES) if rng.random() < preamble_share else None
            text = f"{preamble} {task['prompt']}" if preamble else task["prompt"]
            if task["key"] in guard.eval_keys or _digest(words(text)) in guard.seen:
                continue
            guard.add_eval(task["key"], task["prompt"])
            guard.add_eval(task["key"], text)
            count += 1
            item = {"id": f"{domain}-{count:04d}", "domain": domain, "prompt": text,
                    "reference": task["reference"]}
            if rng.random() < chat_share:
                item["prompt"] = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS[domain])},
                                  {"role": "user", "content": text}]
            if rng.random() < 0.2:
                item["verifier"] = DEFAULT_VERIFIERS[domain]
            items.append({"item": item, "task": task, "preamble": preamble, "text": text})
    return items
