import pytest

from verifiers import registry
from verifiers.registry import VERIFIERS, VerifierConfig

# One spec per verifier, each with its reference, and a wrong completion for it.
CASES = {
    "math": ({"answer": "\\frac{3}{4}", "question": "What is 3/4 as a fraction?"}, "\\boxed{0.7}"),
    "code": ({"entry_point": "double", "tests": "def check(candidate):\n    assert candidate(4) == 8\n",
              "solution": "def double(x):\n    return 2 * x\n"}, "def double(x):\n    return x\n"),
    "json_schema": ({"schema": {"type": "object", "required": ["ok"], "properties": {"ok": {"const": True}}},
                     "answer": {"ok": True}}, 'Here: {"ok": false}'),
    "exact": ({"answer": "Mount Everest"}, "K2"),
}


def test_every_registered_verifier_has_a_case():
    assert set(CASES) == set(VERIFIERS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gold_self_test_scores_one_and_a_wrong_answer_scores_zero(name):
    spec, wrong = CASES[name]
    gold = registry.self_test(name, spec)
    assert (gold.reward, gold.passed, gold.status) == (1.0, True, "ok")
    verdict = registry.verify(name, spec, wrong)
    assert (verdict.reward, verdict.passed, verdict.status) == (0.0, False, "wrong")


def test_self_test_without_reference():
    assert registry.self_test("exact", {}).status == "format_error"
    tests_only = {"entry_point": "f", "tests": "def check(candidate):\n    assert candidate() == 1\n"}
    assert registry.self_test("code", tests_only).passed
    assert registry.self_test("code", {"entry_point": "f", "tests": "def check(c) oops"}).status == "format_error"
    assert registry.self_test("json_schema", {"schema": {"type": "object"}}).passed
    assert registry.self_test("json_schema", {"schema": {"type": "thing"}}).status == "format_error"


def test_verify_never_raises():
    assert registry.verify("nope", {}, "x").status == "format_error"
    assert registry.verify("math", None, "x").status == "format_error"
    assert registry.verify("exact", {"answer": "a"}, None).status == "format_error"
    # jsonschema raises on a $ref it cannot resolve (it never fetches): the boundary
    # turns that into data.
    broken = {"schema": {"$ref": "https://example.invalid/schema.json"}}
    verdict = registry.verify("json_schema", broken, '{"a": "x"}')
    assert verdict.status == "sandbox_error" and "raised" in verdict.detail


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_verifier_scores_the_answer_after_the_thinking(name):
    spec, wrong = CASES[name]
    gold = registry.gold_completion(name, spec)
    # A wrong draft while thinking, the right answer after it (the template opened the block).
    assert registry.verify(name, spec, f"<think>\n{wrong}\n</think>\n\n{gold}").passed
    assert registry.verify(name, spec, f"{wrong}\n</think>\n{gold}").passed
    # The right answer only while thinking: a wrong answer after it, or none (cut off).
    assert registry.verify(name, spec, f"<think>\n{gold}\n</think>\n{wrong}").status == "wrong"
    cut = registry.verify(name, spec, f"<think>\n{gold}\nLet me double-check")
    assert (cut.status, cut.reward) == ("format_error", 0.0) and "<think>" in cut.detail


def test_domain_mapping_is_configuration():
    config = VerifierConfig()
    assert [config.verifier_for(d) for d in ("math", "code", "json")] == ["math", "code", "json_schema"]
    assert config.verifier_for("math", explicit="exact") == "exact"
    assert VerifierConfig(domain_map={"trivia": "exact"}).verifier_for("trivia") == "exact"
    with pytest.raises(ValueError, match="no verifier for domain 'poetry'"):
        config.verifier_for("poetry")
    with pytest.raises(ValueError, match="unknown verifier 'regex'"):
        config.verifier_for("math", explicit="regex")
    with pytest.raises(ValueError, match="unknown verifiers"):
        VerifierConfig(domain_map={"math": "wolfram"})
    with pytest.raises(ValueError, match="math_timeout_s"):
        VerifierConfig(math_timeout_s=0)


def test_config_reaches_the_verifiers():
    spec, _ = CASES["code"]
    slow = "import time\ndef double(x):\n    time.sleep(5)\n    return 2 * x\n"
    config = VerifierConfig(sandbox=registry.SandboxConfig(timeout_s=0.5))
    assert registry.verify("code", spec, slow, config).status == "timeout"


@pytest.mark.parametrize("domain, explicit, message", [
    ("math", ["math"], "verifier must be a string, got list"),
    ({"name": "math"}, None, "domain must be a string, got dict"),
    ({"name": "math"}, "math", "domain must be a string, got dict"),
])
def test_a_choice_of_the_wrong_type_is_a_value_error_not_a_crash(domain, explicit, message):
    # Callers turn ValueError into a verdict or a refusal; a TypeError escaped them.
    with pytest.raises(ValueError, match=message):
        VerifierConfig().verifier_for(domain, explicit)


def test_reference_problem_says_what_the_verifier_needs():
    assert [registry.reference_problem(name, spec) for name, (spec, _) in sorted(CASES.items())] == [None] * 4
    assert "needs `answer`" in registry.reference_problem("math", {"foo": "4"})
    assert "needs `schema`" in registry.reference_problem("json_schema", {"answer": {"a": 1}})
    # the spec checks that verify itself applies, so a reference passing here is not
    # later an "invalid spec" on every sample
    assert "schema" in registry.reference_problem("json_schema", {"schema": {"type": "thing"}})
    assert "compile" in registry.reference_problem("code", {"entry_point": "f", "tests": "def check(c) oops"})
    assert "unknown verifier" in registry.reference_problem("regex", {"answer": "a"})
    assert "JSON object" in registry.reference_problem("exact", ["a"])
