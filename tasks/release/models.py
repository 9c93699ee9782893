"""Where model folders live: registered in `models`, stored locally or in the bucket.

A model's `uri` is a local folder or `s3://bucket/models/<version>/`. Generation and
training need a local folder, so an S3 model is downloaded once into
FLYWHEEL_HOME/models/<version>. Publishing a trained folder uploads it when the lake
is on S3, so any worker can load any version.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pyarrow as pa

from storage.lake import LakeError, append_rows, open_lake, transaction
from storage.objects import ObjectStore, parse_s3_uri
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings


class ModelNotFound(LookupError):
    """No model with that version (or no production model) in the lake."""


class ModelFolderError(ValueError):
    """A folder that is not a model flywheel can serve and train; the message says why."""


def folder_version(model_dir: Path) -> str:
    """Content hash of a Hugging Face folder: the same weights get the same version."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(model_dir).rglob("*") if p.is_file()):
        digest.update(path.relative_to(model_dir).as_posix().encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def publish_model(settings: LakeSettings, model_dir: Path, version: str) -> str:
    """The uri to record for `model_dir`: uploaded to the bucket when the lake is on S3."""
    if not settings.uses_s3:
        return str(Path(model_dir).resolve())
    return ObjectStore(settings).upload_dir(Path(model_dir), settings.s3_bucket, f"models/{version}")


def copy_model(settings: LakeSettings, model_dir: Path, version: str) -> str:
    """The uri to record for a copy of `model_dir` that belongs to `settings`' lake (a lake
    being moved there): uploaded to its bucket (publish_model), or copied to
    home/models/<version>, where an import puts a folder; the copy is whole or absent."""
    if settings.uses_s3:
        return publish_model(settings, model_dir, version)
    final = settings.home / "models" / version
    staging = final.with_name(f".copy-{uuid.uuid4().hex[:12]}")
    try:
        shutil.copytree(model_dir, staging)
        _put_in_place(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return publish_model(settings, final, version)


def local_model_dir(settings: LakeSettings, con: duckdb.DuckDBPyConnection, version: str) -> Path:
    row = con.execute("SELECT uri, weights_deleted_at FROM lake.models WHERE policy_version = ?",
                      [version]).fetchone()
    if row is None:
        raise ModelNotFound(f"no model {version!r} in the lake (`flywheel model list` shows them)")
    uri, deleted = row
    if deleted is not None:
        raise ModelNotFound(weights_deleted(version, deleted))
    if not uri.startswith("s3://"):
        return Path(uri)
    cache = settings.home / "models" / version
    if not (cache / "config.json").exists():
        _download(settings, uri, cache)
    # Handed out now: lake maintenance leaves a copy handed out within its grace alone
    # (tasks/release/retention.py: drop_local_copies), as it does a file a reader may scan.
    os.utime(cache)
    return cache


def _download(settings: LakeSettings, uri: str, cache: Path) -> None:
    """The bucket's folder at `cache`, whole or not at all: downloaded beside it and renamed
    into place, so a download killed midway (a preempted worker) leaves no folder whose
    config.json says it is there while its weights are not."""
    bucket, prefix = parse_s3_uri(uri)
    staging = cache.with_name(f".download-{uuid.uuid4().hex[:12]}")
    try:
        ObjectStore(settings).download_dir(bucket, prefix, staging)
        if not (staging / "config.json").exists():
            raise ModelNotFound(f"the bucket holds no model at {uri} (no config.json there)")
        if cache.exists() and not (cache / "config.json").exists():
            shutil.rmtree(cache)  # what a download by an older flywheel, killed midway, left
        try:
            staging.rename(cache)
        except OSError:  # another process put the same bytes there first: theirs is as good
            if not (cache / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def weights_deleted(version: str, when) -> str:
    return (f"the weights of model {version!r} were deleted by lake maintenance on {when:%Y-%m-%d} "
            "([maintenance] model_weights_days): its rows stay, it cannot be loaded")


SHORTEST_PREFIX = 6  # as short as a version may be typed; git's own abbreviations are 7


def find_version(con: duckdb.DuckDBPyConnection, text: str) -> str | None:
    """The model version `text` names, as a person types it: the whole version or, as git
    takes a short hash, a prefix of at least SHORTEST_PREFIX characters that starts exactly
    one version (messages and reasons show the first 12). None when none matches; a prefix
    several versions start with is a ModelNotFound naming them, never a guess."""
    text = text.strip()
    if con.execute("SELECT count(*) FROM lake.models WHERE policy_version = ?", [text]).fetchone()[0]:
        return text
    if len(text) < SHORTEST_PREFIX:
        return None
    matches = [r[0] for r in con.execute("SELECT DISTINCT policy_version FROM lake.models "
                                         "WHERE starts_with(policy_version, ?) ORDER BY 1", [text]).fetchall()]
    if len(matches) > 1:
        shown = ", ".join(m[:16] for m in matches[:3]) + (", ..." if len(matches) > 3 else "")
        raise ModelNotFound(f"{text!r} starts {len(matches)} model versions ({shown}); give more of it")
    return matches[0] if matches else None


def resolve_version(con: duckdb.DuckDBPyConnection, text: str) -> str:
    """find_version, or ModelNotFound saying where the versions are."""
    version = find_version(con, text)
    if version is None:
        raise ModelNotFound(f"no model {text!r} in the lake (`flywheel model list` shows them)")
    return version


def production_version(con: duckdb.DuckDBPyConnection) -> str:
    row = con.execute("SELECT policy_version FROM lake.models WHERE status = 'production' "
                      "ORDER BY created_at DESC LIMIT 1").fetchone()
    if row is None:
        raise ModelNotFound("no production model: register one with `flywheel model register DIR` "
                            "(`make demo` builds and registers the tiny demo model)")
    return row[0]


def production_problem(settings: LakeSettings) -> str | None:
    """Why there is no production model to start from (no lake, none registered), else None:
    for commands to say in one line before they start what needs one (a cycle, the gateway)."""
    try:
        con = open_lake(settings, read_only=True)
    except LakeError as exc:
        return str(exc)
    try:
        production_version(con)
    except ModelNotFound as exc:
        return str(exc)
    finally:
        con.close()
    return None


def retire_production(con: duckdb.DuckDBPyConnection, successor: str, why: str) -> tuple[str, ...]:
    """Retire every production model but `successor`, its `reason` now `why` (who superseded
    it and for what), inside the caller's transaction; returns the versions retired. The
    one place a production model stops being one: registering, importing with
    --production, the gate's and a manual promotion all say why alike."""
    previous = tuple(r[0] for r in con.execute(
        "SELECT policy_version FROM lake.models WHERE status = 'production' AND policy_version <> ? "
        "ORDER BY policy_version", [successor]).fetchall())
    con.execute("UPDATE lake.models SET status = 'retired', reason = ? WHERE status = 'production' "
                "AND policy_version <> ?", [why, successor])
    return previous


def newest_candidate(con: duckdb.DuckDBPyConnection) -> str:
    """The most recently trained model still waiting for the gate's decision."""
    row = con.execute("SELECT policy_version FROM lake.models WHERE status = 'candidate' "
                      "ORDER BY created_at DESC, policy_version LIMIT 1").fetchone()
    if row is None:
        raise ModelNotFound("no candidate model: every trained model was promoted or rejected; "
                            "name one with policy_version (`flywheel model list` shows them), or name "
                            "production to score it alone")
    return row[0]


def register_model(con: duckdb.DuckDBPyConnection, settings: LakeSettings, model_dir: Path,
                   reason: str, cycle_id: str = "setup") -> str:
    """Record an existing folder as the production model (the starting point of the loop).
    A folder already recorded (e.g. imported) keeps its row and becomes production."""
    version = folder_version(model_dir)
    row = con.execute("SELECT status FROM lake.models WHERE policy_version = ?", [version]).fetchone()
    if row is not None:
        if row[0] != "production":
            with transaction(con, message=f"model register {version[:12]} (known)"):
                retire_production(con, version, f"manual: superseded by {version}: {reason}")
                con.execute("UPDATE lake.models SET status = 'production', reason = ? WHERE policy_version = ?",
                            [reason, version])
        return version
    record_model(con, settings, model_dir, version, "production", reason, str(Path(model_dir).resolve()),
                 version, cycle_id)
    return version


def import_model(con: duckdb.DuckDBPyConnection, settings: LakeSettings, source: str, dtype: str,
                 cycle_id: str = "setup", base: str | None = None) -> tuple[str, bool]:
    """Convert `source` (HF folder, .gguf file, bundled name, or a PEFT adapter folder merged
    into `base`; trainer.model_import) into FLYWHEEL_HOME/models/<version>, store it, and
    record it with status `imported`. Returns (version, new); importing the same weights
    again changes nothing (but puts back their stored folder if it was deleted)."""
    from trainer.model_adapter import is_adapter
    from trainer.model_import import ModelImportError, convert, resolve_source, source_digest

    path = resolve_source(source)
    adapter, parent = None, None
    if is_adapter(path):
        adapter = path
        path, parent = adapter_base(con, settings, adapter, base)
    elif base is not None:
        raise ModelImportError(f"--base names the model a PEFT adapter was trained on; {source} is a whole model")
    staging = settings.home / "models" / f".import-{uuid.uuid4().hex[:12]}"
    staging.parent.mkdir(parents=True, exist_ok=True)
    try:
        dtype = convert(path, staging, dtype, adapter)
        version = folder_version(staging)
        final = settings.home / "models" / version
        # Two imports of one model at once (two deploy jobs) would both find no row and both
        # append one; the check, the folder and the row are one step per home.
        with _import_lock(settings):
            known = con.execute("SELECT uri FROM lake.models WHERE policy_version = ?", [version]).fetchone()
            if known is not None:
                # Its stored folder deleted by hand (a disk cleaned): the same version is the same
                # bytes, so they go back where the row points, not "nothing changed" over a hole.
                if known[0] == str(final.resolve()) and not (final / "config.json").exists():
                    _put_in_place(staging, final)
                return version, False
            _put_in_place(staging, final)
            origin = (adapter or path).resolve()
            # An adapter's model is two sources: its digest is of both (the adapter's, then the base's).
            digest = source_digest(path) if adapter is None else hashlib.sha256(
                (source_digest(adapter) + source_digest(path)).encode()).hexdigest()
            reason = f"imported from {path.name} as {dtype}" if adapter is None else \
                f"imported from adapter {adapter.name} merged into {parent or path.name} as {dtype}"
            try:
                record_model(con, settings, final, version, "imported", reason, str(origin), digest, cycle_id,
                             parent)
            except BaseException:  # not recorded, so no one uses it: a folder left here would look imported
                shutil.rmtree(final, ignore_errors=True)
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return version, True


@contextlib.contextmanager
def _import_lock(settings: LakeSettings) -> Iterator[None]:
    """Imports into one FLYWHEEL_HOME, one at a time (a kernel lock: a killed import frees it).
    Machines with homes of their own that share a lake are not ordered by it."""
    with (settings.home / "model-import.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def adapter_base(con: duckdb.DuckDBPyConnection, settings: LakeSettings, adapter: Path,
                 base: str | None) -> tuple[Path, str | None]:
    """The model `adapter` merges into, and its version when it is a model of the lake:
    `base` (a lake version, a folder, a .gguf file or a bundled name), else the folder the
    adapter's config names. A hub id is refused: flywheel downloads nothing."""
    from trainer.model_adapter import adapter_base_name, is_adapter
    from trainer.model_import import ModelImportError, resolve_source

    named = adapter_base_name(adapter)  # reads its config: a broken one is said before a base loads
    name = base or named
    where = ("name its base with --base: a folder, a .gguf file, `smollm2`, or a version from "
             "`flywheel model list`")
    if name is None:
        raise ModelImportError(f"{adapter}: its adapter_config.json names no base model; {where}")
    version = None if Path(name).expanduser().exists() else find_version(con, name)
    if version is not None:
        return local_model_dir(settings, con, version), version
    if base is None and not Path(name).expanduser().is_dir():
        raise ModelImportError(f"{adapter}: a PEFT adapter of {name!r}, which is no folder here, and flywheel "
                               f"does not download models; {where}")
    path = resolve_source(name)
    if is_adapter(path):
        raise ModelImportError(f"{name}: the base must be a whole model, not another adapter")
    return path, None


def _put_in_place(staging: Path, final: Path) -> None:
    """One rename, so a reader sees no folder or a whole one. A folder already at `final`
    is one no row points to (what a killed import left) or a deleted one's remains."""
    if final.exists():
        shutil.rmtree(final)
    staging.rename(final)


def record_model(con: duckdb.DuckDBPyConnection, settings: LakeSettings, model_dir: Path, version: str,
                 status: str, reason: str, source: str, sha256: str, cycle_id: str,
                 parent: str | None = None) -> None:
    """Store the folder (the bucket when the lake is on S3) and append its `models` row,
    with what the model says about itself (trainer.model_facts)."""
    from trainer.model_facts import read_facts

    try:
        facts = read_facts(model_dir)
    except (ValueError, OSError) as exc:  # transformers' word for files it cannot read
        raise ModelFolderError(f"{model_dir} is not a model flywheel can use: {exc}") from exc
    uri = publish_model(settings, model_dir, version)
    with transaction(con, message=f"model {status} {version[:12]}"):
        if status == "production":
            retire_production(con, version, f"manual: superseded by {version}: {reason}")
        append_rows(con, "models", pa.Table.from_pylist([{
            "policy_version": version, "parent_version": parent, "uri": uri, "status": status,
            "reason": reason, "created_at": datetime.now(timezone.utc), "cycle_id": cycle_id,
            "source": source, "sha256": sha256, "parameters": facts.parameters,
            "context_length": facts.context_length, "chat_template": facts.chat_template}],
            schema=SCHEMAS["models"]))


def pick_models(con: duckdb.DuckDBPyConnection, policy_version: str | None) -> dict:
    """The model an on-demand evaluation judges (default: the newest candidate; a version or
    a prefix of one, resolve_version) and the production model it is compared with; a
    model that is not there is an error that says so. Production itself is its own
    candidate: scored alone (tasks.release.evaluate.EvalConfig.production_alone)."""
    production = production_version(con)
    candidate = resolve_version(con, policy_version) if policy_version else newest_candidate(con)
    return {"candidate": candidate, "production": production}
