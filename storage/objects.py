"""Raw objects on S3 (MinIO, SeaweedFS, AWS) through the `minio` SDK.

The lake's Parquet files are DuckDB's business (httpfs); this client handles what
is not a table: the bucket itself, landing files, checkpoints. Credentials that the
server refuses become one clear `ObjectStoreError`, never a botocore-style traceback.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import urllib3
from minio import Minio
from minio.error import S3Error

from storage.settings import LakeSettings

_AUTH_CODES = {"SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", "InvalidSignature"}


class ObjectStoreError(RuntimeError):
    """The object store refused or could not be reached; the message says what to fix."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://bucket/some/prefix' -> ('bucket', 'some/prefix')."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket:
        raise ValueError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key


class ObjectStore:
    """A thin, error-translating wrapper over one minio client."""

    def __init__(self, settings: LakeSettings) -> None:
        if not settings.uses_s3:
            raise ObjectStoreError("no S3 endpoint configured: set FLYWHEEL_S3_ENDPOINT (host:port)")
        self.settings = settings
        # Short retries: a wrong endpoint should fail in seconds, not minutes.
        http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=5, read=60),
                                   retries=urllib3.Retry(total=2, backoff_factor=0.2))
        self.client = Minio(settings.s3_endpoint, access_key=settings.s3_access_key,
                            secret_key=settings.s3_secret_key, secure=settings.s3_secure,
                            region=settings.s3_region, http_client=http)

    def ensure_bucket(self, bucket: str | None = None) -> None:
        bucket = bucket or self.settings.s3_bucket
        with self._translate(f"bucket {bucket!r}"):
            if not self.client.bucket_exists(bucket):
                self.client.make_bucket(bucket)

    def list(self, bucket: str, prefix: str) -> Iterator[ObjectInfo]:
        with self._translate(f"s3://{bucket}/{prefix}"):
            for obj in self.client.list_objects(bucket, prefix=prefix, recursive=True):
                if not obj.is_dir:
                    yield _info(obj)

    def stat(self, bucket: str, key: str) -> ObjectInfo:
        with self._translate(f"s3://{bucket}/{key}"):
            return _info(self.client.stat_object(bucket, key))

    def download(self, bucket: str, key: str, path: Path) -> Path:
        with self._translate(f"s3://{bucket}/{key}"):
            self.client.fget_object(bucket, key, str(path))
        return path

    def upload(self, path: Path, bucket: str, key: str) -> str:
        with self._translate(f"s3://{bucket}/{key}"):
            self.client.fput_object(bucket, key, str(path))
        return f"s3://{bucket}/{key}"

    def upload_dir(self, folder: Path, bucket: str, prefix: str) -> str:
        """Upload every file under `folder` to `prefix`, keeping relative paths."""
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            self.upload(path, bucket, f"{prefix.rstrip('/')}/{path.relative_to(folder).as_posix()}")
        return f"s3://{bucket}/{prefix.rstrip('/')}/"

    def remove_prefix(self, bucket: str, prefix: str) -> int:
        """Delete every object under `prefix`; how many there were."""
        from minio.deleteobjects import DeleteObject

        keys = [DeleteObject(info.key) for info in self.list(bucket, prefix.rstrip("/") + "/")]
        with self._translate(f"s3://{bucket}/{prefix}"):
            errors = list(self.client.remove_objects(bucket, keys))  # lazy: nothing is deleted unless read
        if errors:
            raise ObjectStoreError(f"s3://{bucket}/{prefix}: {len(errors)} objects not deleted: {errors[0]}")
        return len(keys)

    def download_dir(self, bucket: str, prefix: str, folder: Path) -> Path:
        prefix = prefix.rstrip("/") + "/"
        for info in self.list(bucket, prefix):
            target = folder / info.key[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            self.download(bucket, info.key, target)
        return folder

    def _translate(self, what: str):
        return _Translate(self.settings, what)


def _info(obj) -> ObjectInfo:
    """A minio listing entry or stat result as our ObjectInfo (ETag without its quotes)."""
    return ObjectInfo(obj.object_name, obj.size or 0, (obj.etag or "").strip('"'))


class _Translate:
    """Context manager turning minio/urllib3 errors into ObjectStoreError."""

    def __init__(self, settings: LakeSettings, what: str) -> None:
        self.settings, self.what = settings, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None:
            return False
        endpoint = self.settings.s3_endpoint
        if isinstance(exc, S3Error):
            if exc.code in _AUTH_CODES:
                raise ObjectStoreError(
                    f"S3 at {endpoint} refused the credentials ({exc.code}) for {self.what}: "
                    "check FLYWHEEL_S3_ACCESS_KEY and FLYWHEEL_S3_SECRET_KEY") from None
            if exc.code == "NoSuchKey":
                raise ObjectStoreError(f"{self.what} does not exist") from None
            raise ObjectStoreError(f"S3 error on {self.what}: {exc.code}: {exc.message}") from None
        if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
            raise ObjectStoreError(f"cannot reach S3 at {endpoint} for {self.what}: {exc}") from None
        return False
