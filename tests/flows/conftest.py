"""Session fixtures for the operations tests: one real Prefect server on loopback."""
from __future__ import annotations

import pytest

from tests import services
from tests.flows.prefect_stack import start_prefect


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    proc, server = start_prefect(tmp_path_factory.mktemp("prefect"))
    yield server
    services.stop(proc)
