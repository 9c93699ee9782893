import pytest

from verifiers import code
from verifiers.sandbox.runner import SandboxConfig

SPEC = {
    "entry_point": "add",
    "tests": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    "solution": "def add(a, b):\n    return a + b\n",
}


def test_gold_scores_one_and_wrong_scores_zero():
    gold = code.verify(SPEC, code.gold_completion(SPEC))
    assert (gold.reward, gold.passed, gold.status) == (1.0, True, "ok")
    assert gold.components == {"correctness": 1.0, "format": 1.0}
    wrong = code.verify(SPEC, "def add(a, b):\n    return a - b\n")
    assert (wrong.reward, wrong.passed, wrong.status) == (0.0, False, "wrong")


def test_program_is_the_last_python_block_else_the_whole_completion():
    completion = ("First try:\n```python\ndef add(a, b):\n    return 0\n```\nFixed:\n"
                  "```python\ndef add(a, b):\n    return a + b\n```\nDone.")
    assert code.extract_program(completion).strip() == "def add(a, b):\n    return a + b"
    assert code.verify(SPEC, completion).passed
    assert code.verify(SPEC, "def add(a, b): return a + b").passed


@pytest.mark.parametrize("completion, status, detail", [
    ("", "format_error", "no program"),
    ("```python\ndef add(a, b) return\n```", "format_error", "SyntaxError"),
    ("def plus(a, b): return a + b", "format_error", "defines no function 'add'"),
    ("def add(a, b): return a + b + undefined_name", "wrong", "NameError"),
    ("import sys\nsys.stdout.write('x' * 2_000_000)\ndef add(a, b): return a + b", "wrong", "died"),
])
def test_failure_statuses(completion, status, detail):
    verdict = code.verify(SPEC, completion)
    assert verdict.status == status and detail in verdict.detail and verdict.reward == 0.0


def test_a_program_that_never_ends_times_out():
    verdict = code.verify(SPEC, "def add(a, b):\n    while True:\n        pass\n",
                          sandbox=SandboxConfig(timeout_s=1.0, cpu_s=2))
    assert verdict.status == "timeout" and not verdict.passed


def test_honest_programs_may_use_common_stdlib_features():
    program = ("import sys, typing, enum, fractions, functools, itertools, json\n"
               "from collections import namedtuple, Counter\nsys.setrecursionlimit(5000)\n"
               "Pair = namedtuple('Pair', 'a b')\nT = typing.TypeVar('T')\nColor = enum.Enum('Color', 'RED')\n"
               "open('scratch.txt', 'w').write('ok')\n@functools.lru_cache\n"
               "def add(a, b):\n    return Pair(a, b).a + Pair(a, b).b + len(open('scratch.txt').read()) - 2\n")
    verdict = code.verify(SPEC, program)
    assert verdict.passed, verdict.detail
    dataclasses = ("from dataclasses import dataclass, field\n@dataclass\nclass Sum:\n    a: int\n"
                   "    b: int = 0\n    log: list = field(default_factory=list)\n"
                   "def add(a, b):\n    return Sum(a, b).a + Sum(a, b).b\n")
    assert code.verify(SPEC, dataclasses).passed


def test_invalid_specs_are_reported_not_run():
    assert code.verify({"entry_point": "f"}, "x").detail.startswith("invalid spec")
    bad_tests = {"entry_point": "f", "tests": "def check(c) pass"}
    assert "do not compile" in code.verify(bad_tests, "def f(): pass").detail
    assert code.verify({"entry_point": "not valid", "tests": "def check(c): pass"}, "x").status == "format_error"


def test_missing_bubblewrap_is_a_sandbox_error_not_a_crash():
    verdict = code.verify(SPEC, code.gold_completion(SPEC),
                          sandbox=SandboxConfig(bwrap_path="/nonexistent/bwrap"))
    assert verdict.status == "sandbox_error" and "bubblewrap" in verdict.detail
