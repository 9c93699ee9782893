"""The registry: verifier names -> one `Verifier` record each (verify, gold completion,
reference shape, spec check, options).

One explicit dict (`VERIFIERS`), no discovery. `verify` here is the boundary the
pipeline calls: whatever a verifier or its input does, it returns a `Verdict`; it hands
the verifier the completion's answer, outside any thinking (verifiers/reasoning.py).
`VerifierConfig` says which verifier a domain uses and how verifiers are bounded.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from verifiers import code, exact, json_schema, math, reasoning
from verifiers.sandbox.runner import SandboxConfig
from verifiers.verdict import Verdict, failed

# The verifier a log or evaluation item of each domain gets unless it names one.
DEFAULT_DOMAIN_MAP: Mapping[str, str] = MappingProxyType({"math": "math", "code": "code", "json": "json_schema"})


@dataclass(frozen=True)
class Verifier:
    """Everything flywheel knows about one verifier, in one record.

    verify: `verify(spec, completion, **options) -> Verdict`.
    gold_completion: the spec's reference written as a completion (None: it has none).
    reference_problem: why a reference does not have the shape this verifier scores
        (None: it has). Ingest quarantines a log with this reason; its fast paths (the
        native scanner and the feature SQL, tasks/ingest/) are held to it by a test.
    spec_problem: for a spec without a gold completion, why it is unusable (None: well
        formed); curation's self-test asks it when there is no gold to run.
    options: the keyword arguments `VerifierConfig` gives `verify`.
    reads_prompt: `verify` takes the task's prompt (`prompt=`), for rules that need the
        question (math: the question's own numbers are not guesses).
    """

    verify: Callable[..., Verdict]
    gold_completion: Callable[[dict], str | None]
    reference_problem: Callable[[dict], str | None]
    spec_problem: Callable[[dict], str | None] | None = None
    options: Callable[[VerifierConfig], dict] = lambda config: {}
    reads_prompt: bool = False


VERIFIERS: dict[str, Verifier] = {
    "math": Verifier(math.verify, math.gold_completion, math.reference_problem,
                     options=lambda config: {"timeout_s": config.math_timeout_s}, reads_prompt=True),
    "code": Verifier(code.verify, code.gold_completion, code.reference_problem, spec_problem=code.spec_problem,
                     options=lambda config: {"sandbox": config.sandbox}),
    "json_schema": Verifier(json_schema.verify, json_schema.gold_completion, json_schema.reference_problem,
                            spec_problem=json_schema.schema_problem),
    "exact": Verifier(exact.verify, exact.gold_completion, exact.reference_problem),
}


@dataclass(frozen=True)
class VerifierConfig:
    """How verification runs.

    domain_map: domain of a log or eval item -> verifier name (a row may name its
        verifier explicitly instead).
    sandbox: isolation and limits for running code (see verifiers/sandbox/runner.py).
    math_timeout_s: wall-clock bound on one math-verify comparison.
    """

    domain_map: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_DOMAIN_MAP))
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
        # Rows come from user files: a list or an object here must be a ValueError the
        # caller turns into a verdict or a refusal, not a TypeError from the dict lookup.
        for key, value in (("verifier", explicit), ("domain", domain)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{key} must be a string, got {type(value).__name__}")
        if explicit is not None:
            if explicit not in VERIFIERS:
                raise ValueError(f"unknown verifier {explicit!r}; known: {sorted(VERIFIERS)}")
            return explicit
        if domain not in self.domain_map:
            raise ValueError(f"no verifier for domain {domain!r}: name one explicitly or add it to "
                             f"domain_map (mapped domains: {sorted(self.domain_map)})")
        return self.domain_map[domain]


def verify(name: str, spec: dict, completion: str, config: VerifierConfig | None = None,
           prompt: str | None = None) -> Verdict:
    """Score one completion of a task whose prompt is `prompt`; never raises (a bad row
    is data, not a crash)."""
    if name not in VERIFIERS:
        return failed("format_error", f"unknown verifier {name!r}; known: {sorted(VERIFIERS)}")
    if not isinstance(spec, dict) or not isinstance(completion, str):
        return failed("format_error", "spec must be a JSON object and completion a string")
    config = config or VerifierConfig()
    # Every verifier scores the answer, never a reasoning model's drafts (verifiers/reasoning.py).
    answer = reasoning.answer_after_thinking(completion)
    if answer is None:
        return failed("format_error", reasoning.CUT_DETAIL)
    try:
        record = VERIFIERS[name]
        options = record.options(config)
        if record.reads_prompt and prompt is not None:
            options["prompt"] = prompt
        return record.verify(spec, answer, **options)
    except Exception as error:  # noqa: BLE001
        # The one boundary where errors become data: a verifier bug or an unforeseen
        # input must cost one verdict, not the whole verification batch. It is marked
        # sandbox_error (infrastructure), so it is kept out of advantages, not scored 0.
        return failed("sandbox_error", f"verifier {name} raised {type(error).__name__}: {error}")


def reference_problem(name: str, reference: dict) -> str | None:
    """Why verifier `name` could never score against `reference` (its shape, then the
    verifier's own spec check), or None. Runs no user code, so it is cheap enough for
    every item of an evaluation file; curation's self-test still runs the gold answer."""
    record = VERIFIERS.get(name)
    if record is None:
        return f"unknown verifier {name!r}; known: {sorted(VERIFIERS)}"
    if not isinstance(reference, dict):
        return f"needs a JSON object, got {type(reference).__name__}"
    problem = record.reference_problem(reference)
    if problem is None and record.spec_problem is not None:
        problem = record.spec_problem(reference)
    return problem


def gold_completion(name: str, spec: dict) -> str | None:
    """The spec's reference written as a completion, or None when the spec has none."""
    record = VERIFIERS.get(name)
    return record.gold_completion(spec) if record is not None and isinstance(spec, dict) else None


def self_test(name: str, spec: dict, config: VerifierConfig | None = None) -> Verdict:
    """Run the verifier on the spec's own reference: a usable spec passes with reward 1.0.

    A spec without a gold completion is checked by its verifier's `spec_problem` when
    it has one: a code spec without a `solution` for well-formed tests, a json_schema
    spec without an example `answer` for a valid schema (docs/architecture.md: the JSON
    reference is just the schema).
    """
    gold = gold_completion(name, spec)
    if gold is not None:
        return verify(name, spec, gold, config)
    record = VERIFIERS.get(name)
    if record is not None and record.spec_problem is not None and isinstance(spec, dict):
        problem = record.spec_problem(spec)
        if problem:
            return failed("format_error", f"invalid spec: {problem}")
        return Verdict(reward=1.0, passed=True, status="ok", detail="no reference answer: spec is well-formed")
    return failed("format_error", f"spec has no reference answer for verifier {name!r}")
