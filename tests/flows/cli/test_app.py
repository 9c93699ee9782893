"""flows/cli/app.py: `flywheel --help` and `flywheel sql` start without the libraries
only other commands need (issue #20: torch and Prefect made both take 5 s)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from storage.lake import open_lake

# pandas too: DuckDB imports it to bind a Python parameter, which storage.lake.open_lake avoids;
# pyarrow and numpy: a reader prints Python rows (storage.query.query_rows), a fifth of start-up
HEAVY = {"torch", "transformers", "prefect", "deepspeed", "vllm", "dask", "distributed", "mlflow",
         "great_expectations", "pandas", "pyarrow", "numpy"}


def imported_by(args: list[str], env: dict[str, str]) -> set[str]:
    """The top-level packages `python -m flows.cli.app ARGS` imports, read from -X importtime."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "flows.cli.app", *args],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return {name.split(".")[0] for name in re.findall(r"^import time:.*\| +([\w.]+)$", result.stderr, re.M)}


@pytest.mark.parametrize("args", [["--help"], ["sql", "SELECT count(*) FROM failure_logs"]])
def test_help_and_sql_import_no_heavy_library(args, lake_settings, tmp_path):
    open_lake(lake_settings).close()
    env = {**os.environ, "FLYWHEEL_HOME": str(lake_settings.home),
           "FLYWHEEL_CONFIG": str(tmp_path / "absent.toml")}
    imported = imported_by(args, env)
    assert {"typer", "flows"} <= imported  # the parse found the imports at all
    assert sorted(imported & HEAVY) == []
