"""Session fixtures for the operations tests: one real Prefect server on loopback,
on an embedded PostgreSQL as in docker-compose (SQLite locks under concurrent writes)."""
from __future__ import annotations

import pytest

from tests.flows.prefect_stack import start_prefect_on_postgres


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    stoppers, server = start_prefect_on_postgres(tmp_path_factory.mktemp("prefect"))
    yield server
    for stop in stoppers:
        stop()


@pytest.fixture(scope="session")
def stack_run(prefect_server, s3_server, tmp_path_factory):
    """One cycle driven through the webhook on docker-compose's services run natively
    (tests/flows/prefect_stack.py); shared by test_stack.py and test_ui.py."""
    from tests.flows.prefect_stack import run_cycle_through_stack

    return run_cycle_through_stack(prefect_server, s3_server, tmp_path_factory.mktemp("stack"))
