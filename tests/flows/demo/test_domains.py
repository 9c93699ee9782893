"""Demo tasks are verifiable: references pass their own checks and failed responses do not."""
import json
import random
import subprocess
import sys

import jsonschema
import pytest

from flows.demo.data.code import FAMILIES
from flows.demo.data.domains import DOMAINS, conversation, sample_task

# Runs each program in a fresh namespace of a plain interpreter and reports pass/fail per program.
_RUNNER = """
import json, sys
results = []
for program in json.load(sys.stdin):
    try:
        exec(program, {"__name__": "__demo__"})
        results.append(True)
    except Exception:
        results.append(False)
print(json.dumps(results))
"""


def run_programs(programs: list[str]) -> list[bool]:
    done = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(programs), capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def program(code: str, reference: dict) -> str:
    return f"{code}\n\n{reference['tests']}\n\ncheck({reference['entry_point']})\n"


def fenced(response: str) -> str:
    return response.rsplit("```python\n", 1)[1].split("```", 1)[0]


def one_task_per_code_family() -> list[dict]:
    rng, tasks = random.Random(7), {}
    while len(tasks) < len(FAMILIES):
        task = sample_task("code", rng)
        tasks.setdefault(task["key"][1], task)
    return [tasks[i] for i in sorted(tasks)]


def test_code_solutions_pass_and_buggy_responses_fail_in_every_family():
    tasks = one_task_per_code_family() + [sample_task("code", random.Random(seed)) for seed in range(40)]
    solutions = run_programs([program(t["reference"]["solution"], t["reference"]) for t in tasks])
    bugs = run_programs([program(fenced(t["response"]), t["reference"]) for t in tasks])
    assert all(solutions), [t["reference"]["entry_point"] for t, ok in zip(tasks, solutions) if not ok]
    assert not any(bugs), [t["reference"]["entry_point"] for t, ok in zip(tasks, bugs) if ok]
    assert all(t["gold"] == f"```python\n{t['reference']['solution']}```" for t in tasks)


def test_json_gold_matches_schema_and_failed_responses_do_not():
    rng = random.Random(3)
    for _ in range(300):
        task = sample_task("json", rng)
        schema = task["reference"]["schema"]
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.validate(json.loads(task["gold"]), schema)
        body = task["response"].split("```json\n")[-1].split("\n```")[0]
        try:
            answer = json.loads(body)
        except json.JSONDecodeError:
            assert task["failure"]["kind"] == "invalid_json"
            continue
        assert task["failure"]["kind"] == "schema_violation"
        assert not jsonschema.Draft202012Validator(schema).is_valid(answer)


def test_math_answers_parse_and_failed_responses_end_wrong():
    from math_verify import parse, verify

    rng = random.Random(5)
    tasks = [sample_task("math", rng) for _ in range(150)]
    for task in tasks:
        gold = parse(task["reference"]["answer"])
        assert gold and verify(gold, parse(task["gold"])), task["reference"]
        last_line = task["response"].strip().splitlines()[-1]
        assert not verify(gold, parse(last_line)), (task["prompt"], task["response"])
    additions = sum(sample_task("math", rng)["key"][0] == "add" for _ in range(2000))
    assert 0.28 < additions / 2000 < 0.36  # the share the demo policy learns from


def test_sample_task_is_reproducible_and_rejects_unknown_domains():
    for domain in DOMAINS:
        assert sample_task(domain, random.Random(9)) == sample_task(domain, random.Random(9))
        task = sample_task(domain, random.Random(9))
        assert set(task) == {"domain", "prompt", "reference", "gold", "key", "response", "failure"}
    with pytest.raises(ValueError, match="math, code, json"):
        sample_task("chemistry", random.Random(0))


def test_conversation_ends_with_the_user_and_sometimes_retries():
    rng = random.Random(1)
    shapes = set()
    for _ in range(400):
        messages = conversation(sample_task("json", rng), rng)
        assert messages[-1]["role"] == "user"
        shapes.add(tuple(m["role"] for m in messages))
    assert ("user",) in shapes and ("user", "assistant", "user") in shapes and ("system", "user") in shapes
