"""docs/architecture.md is the project's truth about its shape: hold the parts that can
drift to the code (packages, tables and columns, stages, the six-file walk)."""
from __future__ import annotations

import re
from pathlib import Path

from storage.schemas import SCHEMAS
from tasks.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()


def test_every_table_and_column_is_documented():
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \|[^|]*\| (.*) \|$", DOC, re.M)}
    assert set(rows) == set(SCHEMAS)
    for name, schema in SCHEMAS.items():
        assert re.findall(r"`(\w+)`", rows[name]) == schema.names, name


def test_every_stage_is_in_the_contract_table_with_its_run():
    for name, stage in STAGES.items():
        module = stage.run.__module__.rsplit(".", 1)[1]
        assert f"| {name} | `tasks/" in DOC and f"`{module}.run`" in DOC, name


def test_every_path_the_doc_names_exists():
    paths = set(re.findall(r"`((?:flows|tasks|trainer|verifiers|storage|tests|docs)/[\w/.]*)", DOC))
    assert len(paths) > 20
    missing = [p for p in sorted(paths) if not (ROOT / p.rstrip("/")).exists()]
    assert missing == []


def test_the_walk_opens_at_most_six_files():
    walk = DOC.split("## Following one failure log", 1)[1].split("\n## ", 1)[0]
    steps = re.findall(r"^\d+\. `([^`]+)`", walk, re.M)
    assert 1 <= len(steps) <= 6 and all((ROOT / step).is_file() for step in steps)
