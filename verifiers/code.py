"""`code`: run the completion's program against the spec's tests in the sandbox.

The program is the completion's last fenced ```python block, or the whole completion
when it has none (docs/architecture.md). The spec is {"entry_point": "f", "tests": "<source
defining check(candidate)>", "solution": optional known-good program}. Inside the
sandbox, `code_harness.py` runs program, tests, then `check(entry_point)` and reports
one result line that carries a per-run random nonce; how the nonce is kept out of the
program's reach is that module's docstring. This module only decides what a run means:

  status             when
  ok (passed)        the harness's nonce line says "pass"
  wrong              an assertion or exception in program/tests/check, a dead program
  format_error       no program, a syntax error, no function named entry_point
  timeout            the sandbox's wall clock ran out
  sandbox_error      the sandbox could not run the program (bubblewrap missing, ...)
  hacking_suspected  the harness recorded a refused operation, or stdout holds a result
                     line without the nonce, or the program ended with status 0 and no
                     result line (os._exit(0) before check returned)

A spec whose tests do not compile or lack `entry_point` is reported as format_error
with "invalid spec"; curation's gold self-test drops such tasks.
"""
from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

from verifiers.code_harness import RESULT_MARK
from verifiers.sandbox.runner import RunResult, SandboxConfig, SandboxUnavailable, run_python
from verifiers.verdict import Verdict, failed

_HARNESS_SOURCE = Path(__file__).with_name("code_harness.py").read_text()
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_OUTCOMES = {  # harness outcome -> (status, correctness)
    "pass": ("ok", 1.0),
    "wrong": ("wrong", 0.0),
    "syntax": ("format_error", 0.0),
    "no_entry": ("format_error", 0.0),
    "bad_tests": ("format_error", 0.0),
    "hacking": ("hacking_suspected", 0.0),
}


def extract_program(completion: str) -> str:
    """The last ```python block's body, else the whole completion."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def reference_problem(reference: dict) -> str | None:
    """The reference shape this verifier scores (see verifiers.registry.Verifier); whether
    the tests compile and the solution passes is curation's self-test."""
    entry_point, tests = reference.get("entry_point"), reference.get("tests")
    if not isinstance(entry_point, str) or not _IDENTIFIER.match(entry_point):
        return "needs `entry_point`, a Python identifier"
    if not isinstance(tests, str) or "def check" not in tests:
        return "needs `tests`, Python source defining check(candidate)"
    if not isinstance(reference.get("solution", ""), str):
        return "needs `solution`, when given, to be Python source (a string)"
    return None


def spec_problem(spec: dict) -> str | None:
    """Why this spec cannot be used, or None."""
    entry_point, tests = spec.get("entry_point"), spec.get("tests")
    if not isinstance(entry_point, str) or not _IDENTIFIER.match(entry_point):
        return 'needs "entry_point": a Python identifier'
    if not isinstance(tests, str):
        return 'needs "tests": Python source defining check(candidate)'
    try:
        compile(tests, "<tests>", "exec")
    except (SyntaxError, ValueError) as error:
        return f"tests do not compile: {error}"
    if not re.search(r"^\s*def\s+check\s*\(", tests, re.MULTILINE):
        return "tests define no check(candidate)"
    return None


def verify(spec: dict, completion: str, *, sandbox: SandboxConfig = SandboxConfig()) -> Verdict:
    problem = spec_problem(spec)
    if problem:
        return failed("format_error", f"invalid spec: {problem}", correctness=0.0, format=0.0)
    program = extract_program(completion)
    if not program.strip():
        return failed("format_error", "no program in the completion", correctness=0.0, format=0.0)
    nonce = secrets.token_hex(16)
    payload = json.dumps({"nonce": nonce, "program": program, "tests": spec["tests"],
                          "entry_point": spec["entry_point"]})
    try:
        result = run_python(_HARNESS_SOURCE, stdin=payload, config=sandbox)
    except SandboxUnavailable as error:
        return failed("sandbox_error", str(error))
    return interpret_run(result, nonce)


def interpret_run(result: RunResult, nonce: str) -> Verdict:
    """Turn one sandbox run of the harness into a verdict (table in the module doc)."""
    if result.status == "timeout":
        return failed("timeout", result.detail or "the program ran out of time")
    if result.status == "sandbox_error":
        return failed("sandbox_error", result.detail or "the sandbox failed")
    genuine, forged = [], 0
    for line in result.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            parts = line.split(" ", 3) + ["", "", ""]
            if parts[1] == nonce:
                genuine.append((parts[2], parts[3]))
            else:
                forged += 1
    if forged:
        return failed("hacking_suspected", f"stdout holds {forged} result line(s) without the run's nonce",
                      correctness=0.0, format=1.0)
    if len(genuine) != 1:
        return _no_result(result, len(genuine))
    outcome, detail = genuine[0]
    status, correctness = _OUTCOMES.get(outcome, ("sandbox_error", 0.0))
    format_score = 0.0 if outcome in ("syntax", "no_entry") else 1.0
    if status == "ok":
        return Verdict(reward=1.0, passed=True, status="ok",
                       components={"correctness": 1.0, "format": 1.0})
    return failed(status, detail or outcome, correctness=correctness, format=format_score)


def _no_result(result: RunResult, count: int) -> Verdict:
    if count > 1:
        return failed("hacking_suspected", f"{count} result lines with the nonce", correctness=0.0, format=1.0)
    if result.exit_code == 0:
        return failed("hacking_suspected", "the program exited with status 0 before the tests finished",
                      correctness=0.0, format=1.0)
    tail = result.stderr.strip().splitlines()[-1:] or [""]
    reason = "output cap exceeded" if result.output_truncated else f"exit code {result.exit_code}"
    return failed("wrong", f"the program died before the tests finished ({reason}) {tail[0]}".strip(),
                  correctness=0.0, format=1.0)


def gold_completion(spec: dict) -> str | None:
    solution = spec.get("solution")
    return f"```python\n{solution}\n```" if isinstance(solution, str) else None
