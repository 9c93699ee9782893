"""`json_schema`: the last JSON object in the completion, validated against `spec["schema"]`.

"Last" means the object that ends last; when objects nest, the outermost one. A schema
whose root `type` allows an array is answered by the last outermost array or object
(an array schema could never pass on objects alone). Otherwise an array counts only
when it holds an object: a footnote "[1]" after the object does not displace it, but an
object wrapped in an array (`[{"name": "Ada"}]`, or a list of candidate objects) is an
array, which is what a program parsing the reply would get, and it fails an object
schema. The scan tries `json.JSONDecoder.raw_decode` at every `{` and `[` from the end,
so braces inside JSON strings, prose around the object and Markdown fences are all
handled without a hand-written tokenizer.

Why the last object, and only it: a reply that gives the object and then "an example of
an invalid object" fails, as does one that lists candidates ending in an invalid one.
No rule on text can tell an afterthought from a correction ("Draft: {...} On reflection:
{...}" is common), and one that took any valid object, or the only valid one, would pay
a reply that lists objects hoping one matches. With the last one only, listing more
objects never raises the reward, and a model learns to end with its answer, which is
what a program reading the reply needs. Validation is JSON Schema Draft 2020-12 with format checking
(`"format": "email"` etc. are asserted, not just annotations).

What is parsed is JSON as a strict parser reads it: `//` comments, trailing commas,
single or typographic quotes make no object (the reply's reader would reject them too),
and NaN / Infinity, which Python's json accepts, are no numbers: NaN compares false with
every bound, so it would satisfy any `minimum` and `maximum`.

Bounds: only the last SCAN_CHARS characters are searched and at most MAX_STARTS `{`
positions are tried, so a megabyte of braces costs a bounded amount of time.
"""
from __future__ import annotations

import json

import jsonschema
from jsonschema import Draft202012Validator

from verifiers.verdict import Verdict, failed

SCAN_CHARS = 200_000
MAX_STARTS = 2_000


def _not_json(constant: str) -> float:
    raise ValueError(f"{constant} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_not_json)


def find_last_value(text: str, *, arrays: bool) -> dict | list | None:
    """The JSON object (or, with `arrays`, object or array; without, an array only when
    it holds an object) ending last in `text`, outermost when nested; or None."""
    text = text[-SCAN_CHARS:]
    best: tuple[int, dict | list] | None = None
    brace, bracket = text.rfind("{"), text.rfind("[")
    for _ in range(MAX_STARTS):
        start = max(brace, bracket)
        if start < 0:
            break
        if start == brace:
            brace = text.rfind("{", 0, start)
        else:
            bracket = text.rfind("[", 0, start)
        try:
            value, end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):  # nested past the parser's depth: not an answer
            continue
        wanted = isinstance(value, dict) or isinstance(value, list) and (arrays or _holds_object(value))
        # `>=`: a value starting further left that ends at the same place or later
        # contains the one found so far, so it is the outer (wanted) one.
        if wanted and (best is None or end >= best[0]):
            best = (end, value)
    return None if best is None else best[1]


def _holds_object(array: list) -> bool:
    """Whether an object is among the items of `array`, at any depth. Iterative: the
    parser accepts nesting deeper than Python's recursion limit."""
    pending = [array]
    while pending:
        for item in pending.pop():
            if isinstance(item, dict):
                return True
            if isinstance(item, list):
                pending.append(item)
    return False


def _root_allows_array(schema: dict) -> bool:
    kind = schema.get("type")
    return kind == "array" or isinstance(kind, list) and "array" in kind


def reference_problem(reference: dict) -> str | None:
    """The reference shape this verifier scores (see verifiers.registry.Verifier); whether
    the schema is a valid one is curation's self-test (`schema_problem`)."""
    if not isinstance(reference.get("schema"), dict):
        return f"needs `schema` (an object); has {sorted(reference)}"
    return None


def schema_problem(spec: dict) -> str | None:
    """Why `spec["schema"]` is not a usable Draft 2020-12 schema, or None."""
    try:
        Draft202012Validator.check_schema(spec.get("schema"))
    except jsonschema.SchemaError as error:
        return f"schema: {error.message}"
    return None


def verify(spec: dict, completion: str) -> Verdict:
    problem = schema_problem(spec)
    if problem:
        return failed("format_error", f"invalid spec: {problem}", parsed=0.0, valid=0.0)
    schema = spec["schema"]
    arrays = _root_allows_array(schema)
    obj = find_last_value(completion, arrays=arrays)
    if obj is None:
        found = "JSON array or object" if arrays else "JSON object"
        return failed("format_error", f"no {found} found in completion", parsed=0.0, valid=0.0)
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(root)"
        return failed("wrong", f"{len(errors)} schema error(s); at {where}: {errors[0].message}",
                      parsed=1.0, valid=0.0)
    return Verdict(reward=1.0, passed=True, status="ok", components={"parsed": 1.0, "valid": 1.0})


def gold_completion(spec: dict) -> str | None:
    """The spec's example object (`"answer"`), when it has one, as JSON text."""
    answer = spec.get("answer")
    if isinstance(answer, str):
        return answer
    return None if answer is None else json.dumps(answer)
