"""What `flywheel demo-data` plants among clean logs: near duplicates, eval leaks, bad lines.

Each planting function takes a clean record (or an evaluation item's prompt) and the
caller's `random.Random`, and returns the planted variant together with what it did, so
the manifest can say exactly where each one is and why.
"""
import json
import random
import re

from flows.demo.data.similarity import prompt_text, word_jaccard, words
from flows.demo.data.vocab import PREAMBLES

NEAR_DUP_MIN_JACCARD = 0.85
REFORMAT_KINDS = ("case", "whitespace", "punctuation", "fullwidth_digits", "reordered_preamble", "combined")
# Every way a line can fail ingest validation; "missing_field" is a required field other
# than messages/response/reference (model, ts, domain, failure, failure.kind).
MALFORMED_KINDS = [
    "not_json", "not_object", "missing_messages", "messages_not_list", "unknown_role", "empty_content",
    "missing_response", "unknown_domain", "missing_reference", "bad_reference_shape", "bad_ts",
    "oversized_line", "wrong_types", "missing_field",
]
OVERSIZED_BYTES = 64 * 1024

_SYNONYMS = {
    "compute": "calculate", "calculate": "compute", "find": "determine", "write": "implement",
    "returns": "gives", "buys": "purchases", "shop": "store", "each": "every", "every": "each",
    "extract": "pull", "number": "count", "total": "sum", "need": "want", "text": "message",
    "function": "routine", "list": "sequence", "many": "much", "quick": "short", "help": "assist",
}
_FILLERS = ("please", "really", "just", "also", "actually", "exactly", "kindly")
_WORD_SPAN = re.compile(r"[A-Za-z]{2,}")
_SENTENCE_PUNCT = re.compile(r"[.?!,:](?=\s|$)")
_FULLWIDTH = str.maketrans("0123456789", "０１２３４５６７８９")


def _edit_word(rng: random.Random, text: str, span: re.Match) -> tuple[str, str] | None:
    word, start, end = span.group(0), span.start(), span.end()
    op = rng.choice(("substitute", "insert", "delete", "typo"))
    if op == "substitute" and word.lower() in _SYNONYMS:
        new = _SYNONYMS[word.lower()]
        new = new.capitalize() if word[0].isupper() else new
        return text[:start] + new + text[end:], f"substituted '{word}' -> '{new}' at char {start}"
    if op == "insert":
        filler = rng.choice(_FILLERS)
        return text[:start] + filler + " " + text[start:], f"inserted '{filler}' before '{word}' at char {start}"
    if op == "delete" and end < len(text) and text[end] == " ":
        return text[:start] + text[end + 1:], f"deleted '{word}' at char {start}"
    if len(word) >= 4:
        i = rng.randrange(1, len(word) - 2)
        typo = word[:i] + word[i + 1] + word[i] + word[i + 2:]
        if typo != word:
            return text[:start] + typo + text[end:], f"typo '{word}' -> '{typo}' at char {start}"
    return None


def _edit_punctuation(rng: random.Random, text: str) -> tuple[str, str]:
    marks = list(_SENTENCE_PUNCT.finditer(text))
    if not marks:
        return text + "?", "punctuation: appended '?'"
    mark = rng.choice(marks)
    new = rng.choice([p for p in (".", "!", ";", "") if p != mark.group(0)])
    return text[:mark.start()] + new + text[mark.end():], f"punctuation '{mark.group(0)}' -> '{new}' at char {mark.start()}"


def near_duplicate(messages: list[dict], rng: random.Random, tries: int = 12) -> tuple[list[dict], str]:
    """`messages` with one small edit to the first user turn, similar >= NEAR_DUP_MIN_JACCARD.

    Word edits are tried at random places; one that drops the similarity too far (a
    short prompt, an edit mid-sentence) is rejected, and a punctuation change, which
    leaves the words alone, is the fallback that always qualifies.
    """
    at = next(i for i, m in enumerate(messages) if m["role"] == "user")
    text = messages[at]["content"]
    spans = list(_WORD_SPAN.finditer(text))
    edited = None
    for span in rng.sample(spans, min(tries, len(spans))):
        attempt = _edit_word(rng, text, span)
        if attempt and word_jaccard(prompt_text(messages), prompt_text(_replace(messages, at, attempt[0]))) >= NEAR_DUP_MIN_JACCARD:
            edited = attempt
            break
    new_text, edit = edited or _edit_punctuation(rng, text)
    return _replace(messages, at, new_text), edit


def _replace(messages: list[dict], at: int, content: str) -> list[dict]:
    return [dict(m, content=content) if i == at else m for i, m in enumerate(messages)]


def _case(rng, text, preamble):
    upper = text.upper()
    return upper if upper != text and rng.random() < 0.6 else text.lower() if text.lower() != text else upper


def _whitespace(rng, text, preamble):
    parts = text.split(" ")
    out = [parts[0]]
    for part in parts[1:]:
        out.append(rng.choice(("  ", "\n", "\t", " ", " ", "   ")) + part)
    spaced = "".join(out)
    return (" " if spaced == text else "") + spaced + rng.choice(("", " ", "\n"))


def _punctuation(rng, text, preamble):
    marks = list(_SENTENCE_PUNCT.finditer(text))
    if not marks:
        return text + "."
    out, last = [], 0
    for mark in marks:
        out.append(text[last:mark.start()])
        out.append(rng.choice(("", "!", ";", "...")) if rng.random() < 0.7 else mark.group(0))
        last = mark.end()
    changed = "".join(out) + text[last:]
    return changed if changed != text else text[:marks[0].start()] + text[marks[0].end():]


def _fullwidth(rng, text, preamble):
    return text.translate(_FULLWIDTH)


def _reordered_preamble(rng, text, preamble):
    """Move the item's preamble sentence to the other end, or add one to a long item."""
    if preamble and text.startswith(preamble):
        return text[len(preamble):].lstrip() + rng.choice((" ", "\n\n")) + preamble
    added = rng.choice(PREAMBLES)
    return f"{added} {text}" if rng.random() < 0.5 else f"{text}\n\n{added}"


_REFORMATS = {"case": _case, "whitespace": _whitespace, "punctuation": _punctuation,
              "fullwidth_digits": _fullwidth, "reordered_preamble": _reordered_preamble}


def reformat_applies(kind: str, text: str, preamble: str | None) -> bool:
    """Whether `kind` can visibly rewrite an item (digits to widen, a preamble to move or room to add one)."""
    if kind == "fullwidth_digits":
        return any(ch.isdigit() for ch in text)
    if kind == "reordered_preamble":
        # Adding a sentence to a short item would hide it from 13-gram decontamination
        # for a reason the issue does not ask curation to survive.
        return bool(preamble) or len(words(text)) >= 20
    return True


def reformat(kind: str, text: str, preamble: str | None, rng: random.Random) -> tuple[str, list[str]]:
    """`text` rewritten by `kind`; "combined" applies two or three kinds. Returns the kinds used."""
    if kind != "combined":
        return _REFORMATS[kind](rng, text, preamble), [kind]
    pool = [k for k in _REFORMATS if reformat_applies(k, text, preamble) and k != "reordered_preamble"]
    used = rng.sample(pool, rng.randint(2, min(3, len(pool))))
    if preamble and rng.random() < 0.5:
        used.insert(0, "reordered_preamble")
    for k in used:
        text = _REFORMATS[k](rng, text, preamble)
    return text, used


def malformed_line(kind: str, record: dict, rng: random.Random) -> str:
    """A log line broken in the way `kind` names; `record` is a valid log to break."""
    rec = json.loads(json.dumps(record))
    if kind == "not_json":
        line = json.dumps(rec)
        return line[: rng.randint(10, len(line) - 2)]
    if kind == "not_object":
        return json.dumps(rng.choice(([rec], rec["messages"][-1]["content"], 42, None)))
    if kind in ("missing_messages", "missing_response", "missing_reference"):
        del rec[kind.removeprefix("missing_")]
    elif kind == "messages_not_list":
        rec["messages"] = rng.choice((rec["messages"][-1]["content"], rec["messages"][-1]))
    elif kind == "unknown_role":
        rec["messages"][0]["role"] = rng.choice(("robot", "narrator", "moderator", "bot"))
    elif kind == "empty_content":
        rec["messages"][-1]["content"] = ""
    elif kind == "unknown_domain":
        rec["domain"] = rng.choice(("chemistry", "poetry", "sql", "legal"))
    elif kind == "bad_reference_shape":
        rec["reference"] = {"math": {"solution": "391"}, "code": {"entry_point": "f"},
                            "json": {"answer": {"name": "x"}}}[rec["domain"]]
    elif kind == "bad_ts":
        rec["ts"] = rng.choice(("yesterday", "2026-13-45T25:61:00Z", "31/12/2026 10:00", "not-a-date"))
    elif kind == "oversized_line":
        pasted = "".join(f"[{i:05d}] worker heartbeat ok, queue depth {i % 97}\n" for i in range(1800))
        rec["messages"][-1]["content"] += "\n\nHere is the full log:\n" + pasted
    elif kind == "wrong_types":
        rec["messages"][-1]["content"] = rng.choice((42, 3.5))
    elif kind == "missing_field":
        field = rng.choice(("model", "ts", "failure", "failure.kind", "domain"))
        if field == "failure.kind":
            del rec["failure"]["kind"]
        else:
            del rec[field]
    else:
        raise ValueError(f"unknown malformed kind {kind!r}; choose one of {', '.join(MALFORMED_KINDS)}")
    return json.dumps(rec, ensure_ascii=False)
