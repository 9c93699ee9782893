"""Bucket notifications (MinIO, AWS S3) -> the s3:// URIs of newly landed log files.

Only object-created events for the lake's bucket under its landing prefix with a
log suffix count; everything else in a notification is ignored, not an error, so
a broad notification rule never makes the webhook fail. Keys in these events are
URL-encoded (a space arrives as '+'), so they are decoded before use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from storage.settings import LakeSettings

_SUFFIXES = (".jsonl", ".jsonl.gz")


@dataclass(frozen=True)
class LandedObjects:
    uris: list[str]
    """s3://bucket/key of each new log file, in event order, without repeats."""
    markers: list[str]
    """Per URI, what makes this upload unique (sequencer or eTag), for the delivery key."""
    ignored: int


class EventError(ValueError):
    """The body is not a bucket notification at all."""


def landed_objects(event: Any, settings: LakeSettings) -> LandedObjects:
    if not isinstance(event, dict) or not isinstance(event.get("Records"), list):
        raise EventError("expected an S3 bucket notification: a JSON object with a 'Records' list")
    uris: list[str] = []
    markers: list[str] = []
    ignored = 0
    for record in event["Records"]:
        uri, marker = _landed_uri(record, settings)
        if uri is None or uri in uris:
            ignored += 1
            continue
        uris.append(uri)
        markers.append(marker)
    return LandedObjects(uris, markers, ignored)


def _landed_uri(record: Any, settings: LakeSettings) -> tuple[str | None, str]:
    try:
        name = str(record["eventName"])
        bucket = str(record["s3"]["bucket"]["name"])
        obj = record["s3"]["object"]
        key = unquote_plus(str(obj["key"]))
    except (KeyError, TypeError):
        return None, ""
    # MinIO says "s3:ObjectCreated:Put", AWS "ObjectCreated:Put"
    created = name.removeprefix("s3:").startswith("ObjectCreated:")
    wanted = (created and bucket == settings.s3_bucket and key.startswith(settings.landing_prefix)
              and key.endswith(_SUFFIXES) and ".." not in key.split("/"))
    if not wanted:
        return None, ""
    return f"s3://{bucket}/{key}", str(obj.get("sequencer") or obj.get("eTag") or "")
