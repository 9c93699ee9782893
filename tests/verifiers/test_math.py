import threading
import time

import pytest

from verifiers import math as math_verifier

SPEC = {"answer": "391", "question": "What is 17*23?"}


@pytest.fixture(autouse=True)
def fresh_cache():
    """Each test asks the helpers itself (a cached answer would skip the warm-up calls)."""
    math_verifier._compare_cached.cache_clear()


@pytest.mark.parametrize("answer, right, wrong", [
    ("391", "17 \\cdot 23 = \\boxed{391}", "\\boxed{381}"),
    ("\\frac{1}{2}", "so the probability is 0.5", "\\boxed{\\frac{1}{3}}"),
    ("0.25", "$\\boxed{\\frac{1}{4}}$", "\\boxed{0.26}"),
    ("\\{1, 2, 3\\}", "The roots are $\\boxed{\\{3, 1, 2\\}}$", "\\boxed{\\{1, 2\\}}"),
])
def test_gold_right_and_wrong_answers(answer, right, wrong):
    spec = {"answer": answer}
    gold = math_verifier.verify(spec, math_verifier.gold_completion(spec))
    assert (gold.reward, gold.passed, gold.components["format"]) == (1.0, True, 1.0)
    assert math_verifier.verify(spec, right).passed
    verdict = math_verifier.verify(spec, wrong)
    assert (verdict.reward, verdict.status, verdict.components["correctness"]) == (0.0, "wrong", 0.0)


def test_unboxed_answer_passes_with_lower_format_score_and_no_answer_is_format_error():
    verdict = math_verifier.verify(SPEC, "17*23 = 391")
    assert verdict.passed and verdict.components == {"correctness": 1.0, "format": 0.5}
    assert math_verifier.verify(SPEC, "I am not sure.").status == "format_error"
    assert math_verifier.verify({"answer": 391}, "391").passed  # a JSON number is an answer, as ingest accepts it
    assert math_verifier.verify({"answer": [391]}, "391").detail.startswith("invalid spec")


def test_megabyte_completion_is_bounded_and_still_reads_the_final_answer():
    started = time.perf_counter()
    verdict = math_verifier.verify(SPEC, "blah 12 " * 130_000 + "\nso \\boxed{391}")
    assert verdict.passed and time.perf_counter() - started < 3.0


def test_power_tower_returns_within_the_timeout():
    math_verifier.verify(SPEC, "\\boxed{391}")  # warm helper: its start-up is not under test
    started = time.perf_counter()
    verdict = math_verifier.verify(SPEC, "\\boxed{9^{9^{9^9}}}", timeout_s=2.0)
    assert verdict.status in ("wrong", "timeout") and not verdict.passed
    assert time.perf_counter() - started < 2.5


def test_helper_that_does_not_answer_is_killed_and_replaced():
    math_verifier.verify(SPEC, "\\boxed{391}")
    started = time.perf_counter()
    verdict = math_verifier.verify(SPEC, "\\boxed{9^{9^{9^9}}}", timeout_s=0.3)
    assert verdict.status == "timeout" and time.perf_counter() - started < 1.0
    assert math_verifier.verify(SPEC, "\\boxed{391}").passed  # a fresh helper takes over


def test_works_from_worker_threads():
    results = [None] * 6

    def work(i):
        results[i] = math_verifier.verify(SPEC, f"\\boxed{{{391 if i % 2 else 390}}}").passed

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [False, True] * 3


@pytest.mark.parametrize("gold, text", [
    ("58", "58"), ("58", "59"), ("58", " 58\n"), ("-5", "-5"), ("0", "0"), ("7", "-7"),
    ("12345678901234567", "12345678901234567"),
    # not canonical: math-verify reads these its own way ("058" is 58, "+5" nothing, "-0" -0)
    ("58", "058"), ("5", "+5"), ("0", "-0"), ("7", "00"), ("1/2", "1/2"), ("58", "58.0"),
])
def test_the_integer_shortcut_says_what_math_verify_says(gold, text):
    shortcut = math_verifier.integer_comparison(gold, text)
    asked = math_verifier._POOL.compare(gold, text, 5.0)
    assert shortcut is None or shortcut == asked
    left_to_math_verify = {("58", "058"), ("5", "+5"), ("0", "-0"), ("7", "00"), ("1/2", "1/2"), ("58", "58.0")}
    assert (shortcut is None) == ((gold, text) in left_to_math_verify)


def test_an_answer_math_verify_judged_is_not_asked_again(monkeypatch):
    asked = []
    real = math_verifier._POOL.compare
    monkeypatch.setattr(math_verifier._POOL, "compare", lambda *a: asked.append(a) or real(*a))
    verdicts = [math_verifier.verify(SPEC, "so \\boxed{391}") for _ in range(8)]
    assert all(v.passed for v in verdicts) and len(asked) == 1
