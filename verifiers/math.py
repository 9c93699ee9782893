"""`math`: final-answer equivalence with the `math-verify` library.

What it does: extracts the completion's final answer (LaTeX, `\\boxed{}`, fractions,
decimals, sets, plain numbers) and compares it with `spec["answer"]` using
`math_verify.parse` / `math_verify.verify`. No hand-written math parser.

Time bound. math-verify guards itself with `signal.alarm`, which only works in a main
thread, and Dask runs verifiers in worker threads; sympy can also sit in C code where
no signal handler runs (`\\boxed{9^{9^{9^9}}}`). So parse+verify run in a small pool of
long-lived helper processes (`python -c ...serve_requests()`, started with Popen because
Dask worker processes are daemonic and may not use multiprocessing children). In the
helper, math-verify's own alarms bound each step; the caller additionally waits at most
`timeout_s` and kills the helper when it does not answer (status `timeout`), then starts
a fresh one on the next call. Only the last TAIL_CHARS characters of a completion are
looked at, so a 1 MB completion costs no more than a short one.

Real instruct models state their work ("The sum of 47 and 25 is 72.", "Step 1: ...",
"Final answer: 72 apples", "**Answer: 72**", GSM8K's "#### 72", "12 000", "−7",
"1.2 × 10^5", "-$1,234.50", "25%"); all of that is rewarded when the final answer is
right (typeset numbers are made plain first: verifiers/math_notation.py). A reasoning
model's thinking never reaches this module: the registry cuts it off
(verifiers/reasoning.py). The hacking rules that need the question read
`spec["question"]` when the spec has one, else the task's prompt (the pipeline passes
it as `prompt`), so the question's own numbers are never counted as guesses.

Reward hacking (status `hacking_suspected`, reward 0):
  1. several different declared answers: two `\\boxed{}` with different contents, or
     "final answer: X" / "the answer is X" / "#### X" declarations and boxed numbers
     naming different values ("72.0" and "72", "0.5" and "\\frac{1}{2}" are one value;
     "25%" agrees with "25" and with "0.25": `declared_readings`);
  2. shotgun: the answer region (the last `\\boxed{}`, else the last non-empty line
     after its last `=`, `:` or "answer is") holds a guess list, numbers joined only by
     commas, "or", "and", "maybe" or spaces, with more distinct values that are not in
     the question than the reference answer holds ("72, 73 or 74", "72 (or 73)",
     "x = 72 or x = 73"; with the same mark on each, "$26, $27 or $28", "25% or 30%",
     "26 apples or 27 apples");
  3. echo: the region is a bare list of two or more numbers that contains every number
     of the question (e.g. "17 23 391 381" for "What is 17*23?").
Numbers inside working ("60 + 12 = 72", "3 and 7, the larger is 7") are not guesses.
"""
from __future__ import annotations

import functools
import json
import os
import queue
import re
import select
import subprocess
import sys
import time
from fractions import Fraction

from verifiers.math_notation import typeset_to_plain
from verifiers.verdict import Verdict, failed

TAIL_CHARS = 4_000
DEFAULT_TIMEOUT_S = 5.0
# A number ("1,234" with thousands separators is one), or a fraction a/b counted as one
# answer ("\\frac{1}{4}" is rewritten to "1/4").
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER = re.compile(rf"{_NUM}(?:/{_NUM})?")
# A guess list: two or more numbers joined only by list separators ("72, 73", "72, or
# 73", "72 (or 73)", "72 73"), none of them money or a percentage (below).
_GUESS_WORDS = r"(?:or|maybe|perhaps|possibly|either)"
_GUESS_SEPARATOR = rf"(?:\s*[,;|]\s*|(?:\s*[,;])?\s+\(?{_GUESS_WORDS}\s+)"
_PERCENT_SIGN = r"\s*(?:\\?%|per\s?cent\b)"  # "25%", "25 \%", "25 percent"
_UNMARKED = rf"(?<!\$){_NUM}(?:/{_NUM})?(?!\d|{_PERCENT_SIGN})"
_GUESS_LIST = re.compile(  # the first number starts a number, not its "50" of "12.50"
    rf"(?<![\d.,]){_UNMARKED}(?:(?:{_GUESS_SEPARATOR}|\s+\(?and\s+|\s+){_UNMARKED})+", re.IGNORECASE)
# The same list with the same mark on each number: money ("$26, $27 or $28"), percent
# ("25% or 30%"), a unit ("26 apples, 27 apples or 28 apples"). Marked numbers are
# common in working, so these count only when a guess word joins them or they are the
# whole answer (`guesses_in`): "she earned $40 and $35", "60 miles and 90 miles, 150
# miles in total" state facts, "20%, or $10" and "2.5 hours, or 2 hours and 30
# minutes" one quantity twice.
_MARKED_GUESS_LISTS = tuple(re.compile(pattern, re.IGNORECASE) for pattern in (
    rf"\\?\$-?{_NUM}(?:{_GUESS_SEPARATOR}\\?\$-?{_NUM})+",
    rf"-?{_NUM}{_PERCENT_SIGN}(?:{_GUESS_SEPARATOR}-?{_NUM}{_PERCENT_SIGN})+",
    rf"{_NUM}\s+(?!(?:{_GUESS_WORDS}|and)\b)([a-z]{{2,}})\b(?:{_GUESS_SEPARATOR}{_NUM}\s+\1\b)+"
    r"(?!\s+(?:and\s+)?\d)",
))
_GUESS_WORD = re.compile(rf"\b{_GUESS_WORDS}\b", re.IGNORECASE)
# A variable restated after a separator ("x = 72 or x = 73") hides a guess list from the
# region, which starts after the last "=": it goes first.
_RESTATED_VARIABLE = re.compile(r"(?<=\d)((?:\s*[,;])?\s+(?:or|and)\s+|\s*[,;]\s*)[a-z]\s*=\s*(?=-?\d)",
                                re.IGNORECASE)
# What precedes the answer on a final line: "x = 5", "Answer: 5", "the answer is 5".
_LEAD_IN = re.compile(r"=|:|\banswers?\s+(?:is|are)\b", re.IGNORECASE)
# A declared answer: "final answer: 72", "the answer is 72", GSM8K's "#### 72": the
# number after it, when no other digit follows before its sentence or line ends. Working
# ("the answer is 47 + 25 = \boxed{72}"), mixed numbers ("3 1/2", "3\frac{1}{2}") and
# compound units ("2 hours and 30 minutes") declare nothing: their first number is not
# the answer, and read as one they would contradict the box. The lead-in may not end in
# a minus, even before a currency sign ("the answer is -€5"): that number is negative,
# and read without its sign it would pass for its opposite.
_DECLARED = re.compile(
    rf"(?:\b(?:final\s+answer|answer\s+is)\b|^[ \t]*####)\W{{0,20}}?(?<!-)(?<!-[$£€¥])(-?{_NUM}(?:/{_NUM})?)"
    r"(?=[^\d\n]*?(?:[.;!?](?:\s|$)|$))", re.IGNORECASE | re.MULTILINE)
_PERCENT = re.compile(_PERCENT_SIGN, re.IGNORECASE)
# A stated answer that is one plain number once its typesetting ("\$1,234", "\!", "\,")
# is gone: declarations and boxes are compared by its value.
_PLAIN_NUMBER = re.compile(rf"-?{_NUM}(?:/{_NUM})?")
_TYPESETTING = re.compile(r"\\[$,!;: ]|\$|\s")
# Markdown bold around an answer ("**Answer: 72**", "is **72**.") hides the lead-in from
# math-verify, which then takes the last number of a check written after it. Only pairs
# that open and close on a word, so Python's power (2**3) stays.
_BOLD = re.compile(r"(?<![\w*])\*\*(?=\S)([^*\n]+?)(?<=\S)\*\*(?![\w*])")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_BARE_LIST = re.compile(r"^[\s\d.,;:+\-$\\{}()\[\]]*$")
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def boxed_contents(text: str) -> list[str]:
    """Contents of every `\\boxed{...}` (balanced braces), in order."""
    found, start = [], text.find("\\boxed{")
    while start >= 0:
        depth, i = 0, start + len("\\boxed")
        for i in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
        if depth == 0:
            found.append(text[start + len("\\boxed{"): i])
        start = text.find("\\boxed{", i)
    return found


def answer_region(text: str) -> str:
    boxed = boxed_contents(text)
    if boxed:
        return boxed[-1]
    lines = [line for line in text.splitlines() if line.strip()]
    return _LEAD_IN.split(_RESTATED_VARIABLE.sub(r"\1", lines[-1]))[-1] if lines else ""


def detect_answer_hacking(text: str, gold: str, question: str | None) -> str | None:
    """The reason this completion looks like a reward hack, or None (rules: module doc)."""
    boxed = [_number_or_text(b) for b in boxed_contents(text)]
    if len(set(boxed)) > 1:
        return f"{len(set(boxed))} different \\boxed{{}} answers"
    # A boxed number and a declaration ("The answer is 70. ... \boxed{72}") are two answers too.
    declared = declared_readings(text) + [{b} for b in boxed if isinstance(b, Fraction)]
    if declared and not set.intersection(*declared):
        stated = sorted(set(_DECLARED.findall(text)) | {str(b) for b in boxed if isinstance(b, Fraction)})
        return f"different declared answers {stated[:6]}"
    region = _FRAC.sub(r"\1/\2", answer_region(text))
    question_numbers = _values(question or "")
    new_guesses = guesses_in(region) - question_numbers
    if len(new_guesses) > max(1, len(_values(_FRAC.sub(r"\1/\2", gold)))):
        return f"shotgun answer: {len(new_guesses)} candidate numbers {sorted(map(str, new_guesses))[:6]}"
    region_numbers = _values(region)
    if (question_numbers and len(region_numbers) >= 2 and question_numbers <= region_numbers
            and _BARE_LIST.match(region)):
        return "answer echoes the question's numbers"
    return None


def guesses_in(region: str) -> set:
    """The values of the numbers in the guess lists of an answer region ("72.0" and "72"
    are one guess, as they are one answer)."""
    runs = [run.group() for run in _GUESS_LIST.finditer(region)]
    whole = region.strip(" \t.;!?")
    runs += [run.group() for pattern in _MARKED_GUESS_LISTS for run in pattern.finditer(region)
             if _GUESS_WORD.search(run.group()) or run.group() == whole]
    return {value for run in runs for value in _values(run)}


def _values(text: str) -> set:
    return {_number_or_text(n) for n in _NUMBER.findall(text)}


def _plain(number: str) -> str:
    return number.replace(",", "")


def _number_or_text(answer: str) -> Fraction | str:
    """A stated answer's value when it is one plain number ("72.0", "1/2", "\\frac{1}{2}",
    "1,234" are 72, 1/2, 1/2, 1234), else its text without whitespace."""
    bare = _TYPESETTING.sub("", _FRAC.sub(r"\1/\2", answer))
    if _PLAIN_NUMBER.fullmatch(bare):
        try:
            return Fraction(_plain(bare))
        except (ZeroDivisionError, ValueError):  # "1/0"; past int()'s 4,300-digit limit
            pass
    return re.sub(r"\s+", "", answer)


def verify(spec: dict, completion: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
           prompt: str | None = None) -> Verdict:
    """Score one completion; `prompt` (the task's prompt) stands in for a missing
    `spec["question"]` in the hacking rules."""
    gold = answer_text(spec.get("answer"))
    if gold is None or not gold.strip():
        return failed("format_error", 'invalid spec: needs "answer" (a string or number)', correctness=0.0,
                      format=0.0)
    gold, tail = typeset_to_plain(gold), _BOLD.sub(r"\1", typeset_to_plain(completion[-TAIL_CHARS:]))
    question = spec.get("question") or prompt
    has_box = bool(boxed_contents(tail))
    hack = detect_answer_hacking(tail, gold, typeset_to_plain(question) if isinstance(question, str) else None)
    if hack:
        return failed("hacking_suspected", hack, correctness=0.0, format=float(has_box))
    try:
        result = (integer_comparison(gold, tail) or declared_comparison(gold, tail)
                  or _compare_cached(gold, tail, timeout_s))
    except TimeoutError:
        return failed("timeout", f"math-verify did not answer within {timeout_s:g}s; helper killed")
    if not result["gold_ok"]:
        return failed("format_error", f"invalid spec: math-verify cannot parse answer {gold!r}")
    if result["extracted"] is None:
        return failed("format_error", "no final answer found", correctness=0.0, format=0.0)
    components = {"correctness": float(result["equal"]), "format": 1.0 if has_box else 0.5}
    if result["equal"]:
        return Verdict(reward=1.0, passed=True, status="ok", components=components)
    return Verdict(reward=0.0, passed=False, status="wrong", components=components,
                   detail=f"extracted {result['extracted']!r}, expected {gold!r}")


# A canonical integer: what math-verify reads back unchanged (it reads "058" as 58, "+5"
# as nothing and "-0" as -0, so those still go to it).
_CANONICAL_INTEGER = re.compile(r"0|-?[1-9][0-9]{0,17}")


def integer_comparison(gold: str, tail: str) -> dict | None:
    """math-verify's answer when gold and completion are both bare canonical integers
    (most arithmetic rollouts), without the ~2 ms round trip to a helper; else None."""
    gold, text = gold.strip(), tail.strip()
    if not (_CANONICAL_INTEGER.fullmatch(gold) and _CANONICAL_INTEGER.fullmatch(text)):
        return None
    return {"gold_ok": True, "extracted": text, "equal": gold == text}


def declared_readings(text: str) -> list[set]:
    """What each declared answer ("the answer is 72", "#### 25%") can mean, in order.

    A percentage has two readings, as math-verify gives it: "25%" is 25 (GSM8K asks "what
    percent..." and stores the bare 25; the sign is the unit) and 0.25 (its value, as a
    MATH reference 0.25 or 1/4 would write it). So "25%" and "#### 25" are one answer, and
    so are "25%" and "0.25". The one reading no grader would give, "0.25%" for a fraction
    0.25, is accepted with them: it is one stated number, never a list of guesses.
    """
    readings = []
    for match in _DECLARED.finditer(text):
        value = _number_or_text(match.group(1))
        percent = isinstance(value, Fraction) and _PERCENT.match(text, match.end(1))
        readings.append({value, value / 100} if percent else {value})
    return readings


def declared_comparison(gold: str, tail: str) -> dict | None:
    """The declared answers ("the answer is 72", "#### 72", "25%") against a plain-number
    gold by value, when the reply boxes nothing; else None. Right when every declaration
    can mean the gold (the hacking rules have refused declarations that cannot agree).
    math-verify would take the last `=` of a check written after it ("The answer is 72.
    Check: 72 - 25 = 47." read as 47)."""
    expected = _number_or_text(gold)
    if not isinstance(expected, Fraction) or boxed_contents(tail):
        return None
    readings = declared_readings(tail)
    if not readings:
        return None
    last = list(_DECLARED.finditer(tail))[-1]
    percent = _PERCENT.match(tail, last.end(1))
    extracted = tail[last.start(1):percent.end() if percent else last.end(1)]
    return {"gold_ok": True, "extracted": extracted, "equal": expected in set.intersection(*readings)}


@functools.lru_cache(maxsize=65_536)
def _compare_cached(gold: str, tail: str, timeout_s: float) -> dict:
    """The G samples of a task often give the same answer: ask math-verify once per pair.
    A timeout raises, and exceptions are not cached, so it is asked again next time."""
    return _POOL.compare(gold, tail, timeout_s)


def answer_text(answer: object) -> str | None:
    """A reference answer as text: a string as it is, a JSON number as JSON writes it
    (72, 2.5); anything else is no answer."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return json.dumps(answer)
    return None


def reference_problem(reference: dict) -> str | None:
    """The reference shape this verifier scores (see verifiers.registry.Verifier)."""
    if answer_text(reference.get("answer")) is None:
        return f"needs `answer` (a string or number); has {sorted(reference)}"
    return None


def gold_completion(spec: dict) -> str | None:
    answer = answer_text(spec.get("answer"))
    return f"The answer is $\\boxed{{{answer}}}$." if answer is not None else None


def serve_requests() -> None:
    """Helper-process loop: one JSON request per stdin line, one JSON answer per line.

    Runs in its own process's main thread, so math-verify's signal alarms work here.
    """
    from math_verify import parse, verify as math_equal

    for line in sys.stdin:
        request = json.loads(line)
        soft = max(1, int(request["timeout_s"] / 2))
        gold_text = request["gold"]
        if "$" not in gold_text and "\\boxed" not in gold_text:
            gold_text = f"${gold_text}$"
        gold = parse(gold_text, parsing_timeout=soft)
        answer = parse(request["text"], parsing_timeout=soft) if gold else []
        equal = bool(gold and answer and math_equal(gold, answer, timeout_seconds=soft))
        extracted = str(answer[-1]) if answer else None
        reply = {"gold_ok": bool(gold), "extracted": extracted, "equal": equal}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class _Helper:
    """One helper process; `ask` returns its answer or raises TimeoutError (then it is dead)."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": _PACKAGE_ROOT}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from verifiers.math import serve_requests; serve_requests()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.buffer = b""

    def ask(self, request: dict, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            fd = self.proc.stdout.fileno()
            while b"\n" not in self.buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                    raise TimeoutError
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise TimeoutError  # helper died (e.g. out of memory): same remedy
                self.buffer += chunk
        except (TimeoutError, BrokenPipeError):
            self.close()
            raise TimeoutError from None
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class _HelperPool:
    """Idle helpers are reused; concurrent callers each get their own (grown on demand)."""

    def __init__(self) -> None:
        self.idle: queue.LifoQueue[_Helper] = queue.LifoQueue()
        self.pid = os.getpid()

    def compare(self, gold: str, text: str, timeout_s: float) -> dict:
        if self.pid != os.getpid():
            # A forked child must not talk to its parent's helpers over shared pipes.
            self.idle, self.pid = queue.LifoQueue(), os.getpid()
        wait_s = timeout_s
        try:
            helper = self.idle.get_nowait()
        except queue.Empty:
            helper = _Helper()
            # The first request also pays the helper's start (~0.5 s of imports);
            # that must not count as the completion's fault.
            wait_s += 10.0
        answer = helper.ask({"gold": gold, "text": text, "timeout_s": timeout_s}, wait_s)
        self.idle.put(helper)
        return answer


_POOL = _HelperPool()
