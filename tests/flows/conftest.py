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
