"""`code`: run the completion's program against the spec's tests in the sandbox.

Finding the program in a model's reply (`extract_program`):
  * fenced blocks tagged python/py/python3 or untagged are candidates; other languages
    (bash, text, output, json) are not. The program is the last candidate that defines
    the entry point (`def f(` or `f = ...`), preceded by earlier definition-only blocks
    that define a name it uses and lacks (a helper shown in its own block);
  * a reply without fences that parses is taken whole (HumanEval's prompt + solution);
    otherwise the code is found in the prose: from each line starting with def, class,
    import, from or @, the longest run of lines that parses, less trailing lines that
    are prose parsing by accident. The same choice as for blocks then applies; a reply
    of 300+ lines costs at most _MAX_UNFENCED_LINES lines and _MAX_PARSES parses;
  * when nothing defines the entry point, the last candidate goes to the harness anyway,
    so the verdict says why (format_error "no function ...", a syntax error).
Example calls after the function (`print(f(2))`) stay and run; `if __name__ ==
"__main__":` blocks do not (the harness runs the program as module "candidate").

The spec is {"entry_point": "f", "tests": "<source defining check(candidate)>",
"solution": optional known-good program}. Inside the sandbox, `code_harness.py` runs
program, tests, then `check(entry_point)` and reports one result line that carries a
per-run random nonce; how the nonce is kept out of the program's reach is that module's
docstring. This module only decides what a run means:

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

import ast
import builtins
import json
import re
import secrets
import textwrap
from pathlib import Path

from verifiers.code_harness import RESULT_MARK
from verifiers.sandbox.runner import RunResult, SandboxConfig, SandboxUnavailable, run_python
from verifiers.verdict import Verdict, failed

_HARNESS_SOURCE = Path(__file__).with_name("code_harness.py").read_text()
# A fenced block: an opening fence line with an optional language tag, then the body up
# to a line ending in ``` (models sometimes glue the closing fence to the last line) or
# the end of a cut-off reply. Possessive quantifiers and the lookbehind keep a match
# linear in the reply's length: a long line of backticks must not be retried at every split.
_FENCE = re.compile(r"^[ \t]*+`{3,}+[ \t]*+([\w+#.-]*+)[^\n]*+\n(.*?)(?:(?<!`)`{3,}+[ \t]*+$|\Z)",
                    re.DOTALL | re.MULTILINE)
_PYTHON_TAGS = frozenset({"", "python", "python3", "py", "py3"})
_CODE_START = re.compile(r"[ \t]*(?:def |async def |class |import |from |@)")
# Bounds on the search for code in a reply without fences: a huge reply costs at most
# this many lines examined and this many parses.
_MAX_UNFENCED_LINES = 300
_MAX_PARSES = 100
_MAX_PARSE_CHARS = 100_000  # no reply source larger than this is parsed on the host
_MAX_HELPER_BLOCKS = 20
# What a block that only sets up names for a later block holds (no calls, no prints).
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom,
                ast.Assign, ast.AnnAssign)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_OUTCOMES = {  # harness outcome -> (status, correctness)
    "pass": ("ok", 1.0),
    "wrong": ("wrong", 0.0),
    "syntax": ("format_error", 0.0),
    "no_entry": ("format_error", 0.0),
    "bad_tests": ("format_error", 0.0),
    "hacking": ("hacking_suspected", 0.0),
}


def extract_program(completion: str, entry_point: str | None = None) -> str:
    """The program in a model's reply (the module doc says how it is found).

    Without `entry_point`, "defines it" means "defines any function".
    """
    # Windows line endings: the fence pattern's `$` does not match before "\r", so a closing
    # "```\r" would go unseen and the prose after it would join the program.
    completion = completion.replace("\r\n", "\n")
    blocks, outside = _split_fences(completion)
    program = _pick(blocks, entry_point)
    if program is not None:
        return program
    if not blocks and (len(completion) > _MAX_PARSE_CHARS or _parses_as_code(completion)):
        return completion  # a huge reply is not searched: the sandbox's limits judge it
    regions = _code_regions(outside)
    program = _pick(regions, entry_point)
    if program is not None:
        return program
    # Nothing defines the entry point: hand over the likeliest program anyway, so the
    # harness reports what is wrong with it ("no function ...", a syntax error).
    return (blocks or regions or [completion])[-1]


def _split_fences(completion: str) -> tuple[list[str], str]:
    """The bodies of the Python fenced blocks, and the text outside every fenced block."""
    blocks, outside, last = [], [], 0
    for match in _FENCE.finditer(completion):
        outside.append(completion[last:match.start()])
        last = match.end()
        if match.group(1).lower() in _PYTHON_TAGS:
            blocks.append(textwrap.dedent(match.group(2)))
    outside.append(completion[last:])
    return blocks, "\n".join(outside)


def _pick(blocks: list[str], entry_point: str | None) -> str | None:
    """The last block defining the entry point, after the earlier blocks it needs; or None."""
    if entry_point is None:
        defines = re.compile(r"^(?:async[ \t]+)?def[ \t]", re.MULTILINE)
    else:
        name = re.escape(entry_point)
        defines = re.compile(rf"^(?:(?:async[ \t]+)?def[ \t]+{name}[ \t]*\(|{name}[ \t]*(?::[^=\n]*)?=(?!=))",
                             re.MULTILINE)
    for index in range(len(blocks) - 1, -1, -1):
        if defines.search(blocks[index]):
            return _with_helpers(blocks[index], blocks[max(0, index - _MAX_HELPER_BLOCKS):index])
    return None


def _with_helpers(chosen: str, earlier: list[str]) -> str:
    """`chosen`, preceded by the earlier definition-only blocks that define a name it uses
    but does not define ("first a helper: ```...```, now the function: ```...```")."""
    tree = _parse(chosen)
    if tree is None or _has_future_import(tree):  # a __future__ import must come first
        return chosen
    missing = _free_names(tree)
    needed = []
    for block in earlier:
        helper = _parse(block) if missing else None
        if helper is None or _has_future_import(helper):
            continue
        if all(isinstance(node, _DEFINITIONS) for node in helper.body) and _bound_names(helper) & missing:
            needed.append(block)
    return "\n".join(needed + [chosen])


def _has_future_import(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in tree.body)


def _free_names(tree: ast.Module) -> set[str]:
    """Names read but bound nowhere in `tree` (over-approximating what is bound)."""
    loaded = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return loaded - _bound_names(tree) - set(dir(builtins))


def _bound_names(tree: ast.Module) -> set[str]:
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound


def _code_regions(text: str) -> list[str]:
    """The code in a reply without fences: from each line that starts code (def, class,
    import, from, @), the longest run of lines that parses, trailing prose trimmed."""
    lines = text.splitlines()[:_MAX_UNFENCED_LINES]
    regions, start, budget = [], 0, [_MAX_PARSES]
    while start < len(lines) and budget[0] > 0:
        end = _longest_parsing_run(lines, start, budget) if _CODE_START.match(lines[start]) else None
        if end is None:
            start += 1
            continue
        regions.append(textwrap.dedent("\n".join(lines[start:end])) + "\n")
        start = end
    return regions


def _longest_parsing_run(lines: list[str], start: int, budget: list[int]) -> int | None:
    """The largest `end` for which lines[start:end] parses (each parse spends budget), less
    trailing statements that are prose parsing by accident ("Explanation", "Complexity: O(n)")."""
    indent = _indent(lines[start])
    # An indented start (a markdown code block) ends at the first line left of it.
    end = next((k for k in range(start + 1, len(lines)) if lines[k].strip() and _indent(lines[k]) < indent),
               len(lines))
    while end > start and budget[0] > 0:
        next_line = lines[end] if end < len(lines) else ""
        if next_line.strip() and _indent(next_line) > indent or not lines[end - 1].strip():
            end -= 1  # mid-statement, or the same run as a shorter end
            continue
        budget[0] -= 1
        try:
            tree = ast.parse(textwrap.dedent("\n".join(lines[start:end])))
        except SyntaxError as error:
            # Nothing that contains the line the parser stopped at can parse.
            stop = start + error.lineno - 1 if error.lineno else end - 1
            end = max(start, min(end - 1, stop))
            continue
        except (ValueError, RecursionError, MemoryError, OverflowError):
            end -= 1
            continue
        body = tree.body
        while body and _looks_like_prose(body[-1]):
            body = body[:-1]
        return start + body[-1].end_lineno if body else None
    return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _looks_like_prose(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Name)) or (
        isinstance(node, ast.AnnAssign) and node.value is None and node.simple)


def _parses_as_code(source: str) -> bool:
    """Whether `source` parses and neither starts nor ends with a line of prose that
    parses by accident ("Explanation")."""
    tree = _parse(source)
    return tree is not None and not (tree.body and (_looks_like_prose(tree.body[0]) or
                                                    _looks_like_prose(tree.body[-1])))


def _parse(source: str) -> ast.Module | None:
    if len(source) > _MAX_PARSE_CHARS:
        return None  # bounds the host's time; the sandbox still runs such a program
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None


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
    program = extract_program(completion, spec["entry_point"])
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
