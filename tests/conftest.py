"""Fixtures shared by every test folder: lakes on disk, on a real S3 server, on PostgreSQL,
and the real instruct model (SmolLM2-135M-Instruct)."""
from __future__ import annotations

import os
import sys
import uuid

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from storage.settings import LakeSettings  # noqa: E402
from tests import services  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _close_warm_dask_cluster():
    """Each test module that scores code starts the process's warm Dask cluster
    (tasks.round.scoring.local_client); stop its worker processes when the module ends."""
    yield
    scoring = sys.modules.get("tasks.round.scoring")  # not imported: no cluster to close
    if scoring is not None:
        scoring.close_local_cluster()


@pytest.fixture(scope="session", autouse=True)
def _stop_prefect_temporary_server():
    """Flows run without a server start Prefect's temporary one, which stops itself at
    exit and logs that to a stream pytest has closed by then (a "--- Logging error ---"
    traceback after the summary). Stop it here, while the streams are open, once the
    logs still queued for it are sent (else they fail to reach a stopped server)."""
    yield
    server = sys.modules.get("prefect.server.api.server")  # not imported: nothing started
    if server is not None:
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=10)
        for instance in list(server.SubprocessASGIServer._instances.values()):
            instance.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    proc, server = services.start_s3(tmp_path_factory.mktemp("s3"))
    yield server
    services.stop(proc)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct as a plain float32 HF folder, converted once per test run from
    the GGUF that `make` installs (trainer.model_import; ~25 s)."""
    from trainer.model_import import convert, resolve_source

    folder = tmp_path_factory.mktemp("smollm2") / "model"
    convert(resolve_source("smollm2"), folder, "float32")
    return folder


@pytest.fixture(scope="session")
def pg_dsn(tmp_path_factory):
    server, dsn = services.start_postgres(tmp_path_factory.mktemp("pg"))
    yield dsn
    server.cleanup()


@pytest.fixture
def lake_settings(tmp_path) -> LakeSettings:
    """An embedded lake: SQLite catalog and Parquet in a fresh folder."""
    return LakeSettings(home=tmp_path / "home")


@pytest.fixture
def s3_lake_settings(tmp_path, s3_server) -> LakeSettings:
    """A lake whose Parquet lives in a fresh bucket on the real S3 server."""
    return LakeSettings(home=tmp_path / "home", s3_endpoint=s3_server.endpoint,
                        s3_bucket=f"t-{uuid.uuid4().hex[:12]}", s3_access_key=s3_server.access_key,
                        s3_secret_key=s3_server.secret_key)


@pytest.fixture(params=["embedded", "s3"])
def any_lake_settings(request, tmp_path) -> LakeSettings:
    """Run a test against the embedded lake and against S3."""
    if request.param == "embedded":
        return LakeSettings(home=tmp_path / "home")
    return request.getfixturevalue("s3_lake_settings")
