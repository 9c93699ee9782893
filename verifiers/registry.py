"""The registry: verifier names -> plain `verify(spec, completion) -> Verdict` functions.

One explicit dict (`VERIFIERS`), no discovery. `verify` here is the boundary the
pipeline calls: whatever a verifier or its input does, it returns a `Verdict`.
`VerifierConfig` says which verifier a domain uses and how verifiers are bounded.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from verifiers import code, exact, json_schema, math
from verifiers.sandbox.runner import SandboxConfig
from verifiers.verdict import Verdict, failed

VERIFIERS: dict[str, Callable[..., Verdict]] = {
    "math": math.verify,
    "code": code.verify,
    "json_schema": json_schema.verify,
    "exact": exact.verify,
}

# The completion that each verifier's spec considers correct (its `answer` / `solution`).
GOLD_COMPLETIONS: dict[str, Callable[[dict], str | None]] = {
    "math": math.gold_completion,
    "code": code.gold_completion,
    "json_schema": json_schema.gold_completion,
    "exact": exact.gold_completion,
}


@dataclass(frozen=True)
class VerifierConfig:
    """How verification runs.

    domain_map: domain of a log or eval item -> verifier name (a row may name its
        verifier explicitly instead).
    sandbox: isolation and limits for running code (see verifiers/sandbox/runner.py).
    math_timeout_s: wall-clock bound on one math-verify comparison.
    """

    domain_map: Mapping[str, str] = field(
        default_factory=lambda: {"math": "math", "code": "code", "json": "json_schema"})
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    math_timeout_s: float = math.DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        unknown = {d: v for d, v in self.domain_map.items() if v not in VERIFIERS}
        if unknown:
            raise ValueError(f"domain_map names unknown verifiers {unknown}; known: {sorted(VERIFIERS)}")
        # A plain dict copy (not a MappingProxyType): configs travel to Dask workers by pickle.
        object.__setattr__(self, "domain_map", dict(self.domain_map))
        if not self.math_timeout_s > 0:
            raise ValueError(f"math_timeout_s must be > 0 seconds, got {self.math_timeout_s!r}")

    def verifier_for(self, domain: str | None, explicit: str | None = None) -> str:
        """The verifier name for a row: its explicit choice, else its domain's mapping."""
        if explicit is not None:
            if explicit not in VERIFIERS:
                raise ValueError(f"unknown verifier {explicit!r}; known: {sorted(VERIFIERS)}")
            return explicit
        if domain not in self.domain_map:
            raise ValueError(f"no verifier for domain {domain!r}: name one explicitly or add it to "
                             f"domain_map (mapped domains: {sorted(self.domain_map)})")
        return self.domain_map[domain]


def verifier_options(name: str, config: VerifierConfig) -> dict:
    """The keyword arguments that `config` passes to verifier `name`."""
    if name == "math":
        return {"timeout_s": config.math_timeout_s}
    if name == "code":
        return {"sandbox": config.sandbox}
    return {}


def verify(name: str, spec: dict, completion: str, config: VerifierConfig | None = None) -> Verdict:
    """Score one completion; never raises (a bad row is data, not a crash)."""
    if name not in VERIFIERS:
        return failed("format_error", f"unknown verifier {name!r}; known: {sorted(VERIFIERS)}")
    if not isinstance(spec, dict) or not isinstance(completion, str):
        return failed("format_error", "spec must be a JSON object and completion a string")
    config = config or VerifierConfig()
    try:
        return VERIFIERS[name](spec, completion, **verifier_options(name, config))
    except Exception as error:  # noqa: BLE001
        # The one boundary where errors become data: a verifier bug or an unforeseen
        # input must cost one verdict, not the whole verification batch. It is marked
        # sandbox_error (infrastructure), so it is kept out of advantages, not scored 0.
        return failed("sandbox_error", f"verifier {name} raised {type(error).__name__}: {error}")


def gold_completion(name: str, spec: dict) -> str | None:
    """The spec's reference written as a completion, or None when the spec has none."""
    make = GOLD_COMPLETIONS.get(name)
    return make(spec) if make is not None and isinstance(spec, dict) else None


def self_test(name: str, spec: dict, config: VerifierConfig | None = None) -> Verdict:
    """Run the verifier on the spec's own reference: a usable spec passes with reward 1.0.

    A code spec without a `solution` is checked for well-formed tests only, and a
    json_schema spec without an example `answer` for a valid schema only (DESIGN.md:
    the JSON reference is just the schema).
    """
    gold = gold_completion(name, spec)
    if gold is not None:
        return verify(name, spec, gold, config)
    if name in ("code", "json_schema") and isinstance(spec, dict):
        problem = code.spec_problem(spec) if name == "code" else json_schema.schema_problem(spec)
        if problem:
            return failed("format_error", f"invalid spec: {problem}")
        return Verdict(reward=1.0, passed=True, status="ok", detail="no reference answer: spec is well-formed")
    return failed("format_error", f"spec has no reference answer for verifier {name!r}")
