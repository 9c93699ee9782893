"""Demo code tasks: a user asks for a small Python function; the policy's code fails.

The reference carries `entry_point`, `tests` (a `check(candidate)` function) and the
known-good `solution`. Expected values in the tests are computed by running the
family's own solution, so the solution passes its tests by construction; the failed
response is the family's buggy variant in a ```python fence.
"""
import random
import re
from string import Template

from flows.demo.data.code_numbers import LIST_FAMILIES, NUMBER_FAMILIES
from flows.demo.data.code_strings import STRING_FAMILIES
from flows.demo.data.vocab import expand

FAMILIES = STRING_FAMILIES + LIST_FAMILIES + NUMBER_FAMILIES

_OPENERS = (
    "Write a Python function `{sig}` that {desc}.",
    "[Can you|Could you] write a [Python |]function `{sig}` that {desc}?",
    "I need a Python function `{sig}`. It {desc}.",
    "Implement `{sig}` in Python: it {desc}.",
    "Please implement `{name}`, a function that {desc}. Signature: `{sig}`.",
    "Create a function called `{sig}` which {desc}.",
    "Python question: define `{sig}` so that it {desc}.",
    "[Help me write|Write me] `{sig}`; it {desc}.",
)
_EXAMPLES = ("For example, `{call}` should return `{out}`.", "Example: `{call}` returns `{out}`.",
             "e.g. `{call} == {out}`.", "So `{call}` gives `{out}`.")
_EXTRAS = ("Keep it short.", "Add type hints if you can.", "Include a docstring.",
           "It's for interview practice.", "My own attempt keeps failing the tests.",
           "Performance is not a concern.", "Please return only the code.",
           "Handle the edge cases too.", "This is for a small script at work.",
           "Explain the approach in one line.", "Standard library only.")
_INTROS = ("", "Here's the function:\n\n", "Sure! Here is an implementation:\n\n", "Try this:\n\n",
           "This should work:\n\n", "Here you go.\n\n")
_OUTROS = ("", "", "\n\nThis runs in linear time.", "\n\nLet me know if you need tests.",
           "\n\nIt handles the edge cases as well.")

# Word choices people vary when describing the same function; without them two requests
# for one family share long word runs (and 13-grams with the evaluation items).
_DESC_WORDS = {
    "returns": ("returns", "gives back", "outputs", "should return"), "every": ("every", "each"),
    "each": ("each", "every"), "elements": ("elements", "items", "entries"),
    "numbers": ("numbers", "values"), "largest": ("largest", "biggest", "greatest"), "smallest": ("smallest", "lowest"),
    "ignoring": ("ignoring", "disregarding"), "finds": ("finds", "locates", "determines"),
    "computes": ("computes", "calculates", "works out"), "counts": ("counts", "tallies"),
    "consecutive": ("consecutive", "adjacent", "neighbouring"), "otherwise": ("otherwise", "in all other cases"),
    "integer": ("integer", "int", "whole number"),
    "integers": ("integers", "ints", "whole numbers"), "takes": ("takes", "accepts", "receives"),
    "gives": ("gives", "yields", "produces"), "keeping": ("keeping", "preserving", "retaining"),
    "order": ("order", "ordering", "sequence"), "separated": ("separated", "delimited", "split"),
}
_DESC_WORD = re.compile(r"\b(" + "|".join(_DESC_WORDS) + r")\b")

_compiled: dict = {}


def _canonical(index: int, params: dict, args: tuple):
    """The family's solution as a callable, compiled once per parameter choice."""
    key = (index, tuple(sorted(params.items())), args)
    if key not in _compiled:
        fam = FAMILIES[index]
        source = Template(fam["src"]).substitute(name="_solution", **_arg_names(args), **params)
        namespace: dict = {}
        exec(compile(source, f"<demo family {index}>", "exec"), namespace)  # our own source text
        _compiled[key] = namespace["_solution"]
    return _compiled[key]


def _arg_names(args: tuple) -> dict:
    return {f"a{i}": name for i, name in enumerate(args)}


def _call(name: str, inputs: tuple) -> str:
    return f"{name}({', '.join(repr(v) for v in inputs)})"


def _build_tests(rng: random.Random, index: int, params: dict, args: tuple) -> list[tuple]:
    """Edge inputs (which the buggy variant fails) plus a few random ones, with answers."""
    fam = FAMILIES[index]
    edges = fam["edges"](params) if callable(fam["edges"]) else fam["edges"]
    inputs = list(edges) + [fam["inputs"](rng, params) for _ in range(rng.randint(2, 4))]
    rng.shuffle(inputs)
    solve = _canonical(index, params, args)
    return [(case, solve(*case)) for case in inputs]


def _prompt(rng: random.Random, fam: dict, name: str, args: tuple, params: dict, cases: list) -> str:
    desc = Template(rng.choice(fam["desc"])).substitute(**_arg_names(args), **params)
    desc = _DESC_WORD.sub(lambda m: rng.choice(_DESC_WORDS[m.group(1)]), desc)
    sig = f"{name}({', '.join(args)})"
    text = expand(rng.choice(_OPENERS), rng).format(sig=sig, name=name, desc=desc)
    # Examples carry random inputs: they are what keeps two requests for the same
    # function from being near duplicates of each other.
    for case, out in rng.sample(cases, rng.choice((0, 1, 1, 2, 2, 2))):
        text += " " + rng.choice(_EXAMPLES).format(call=_call(name, case), out=repr(out))
    extras = rng.sample(_EXTRAS, rng.choice((0, 0, 1, 1, 2)))
    if extras:
        text += " " + " ".join(extras)
    if rng.random() < 0.15:
        text += f"\n\n```python\ndef {sig}:\n    ...\n```"
    return text


def sample_code(rng: random.Random) -> dict:
    """One code task with its failed response (see `flows.demo.data.domains.sample_task`)."""
    index = rng.randrange(len(FAMILIES))
    fam = FAMILIES[index]
    name, args, params = rng.choice(fam["names"]), rng.choice(fam["args"]), fam["params"](rng)
    cases = _build_tests(rng, index, params, args)
    tests = "def check(candidate):\n" + "".join(
        f"    assert {_call('candidate', case)} == {out!r}\n" for case, out in cases)
    fields = dict(name=name, **_arg_names(args), **params)
    solution = Template(fam["src"]).substitute(fields)
    bug = Template(fam["bug"]).substitute(fields)
    kind, detail = fam["failure"]
    if kind == "test_failed":
        detail = rng.choice(("AssertionError in check(candidate)", "1 of the tests failed", "AssertionError"))
    response = f"{rng.choice(_INTROS)}```python\n{bug}```{rng.choice(_OUTROS)}"
    return {"domain": "code", "prompt": _prompt(rng, fam, name, args, params, cases),
            "reference": {"entry_point": name, "tests": tests, "solution": solution},
            "gold": f"```python\n{solution}```", "key": ("code", index, name, tests),
            "response": response, "failure": {"kind": kind, "detail": detail}}
