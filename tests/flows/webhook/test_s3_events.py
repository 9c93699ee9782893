"""flows/webhook/s3_events.py: which objects of a bucket notification become ingest paths."""
from __future__ import annotations

import pytest

from flows.webhook.s3_events import EventError, landed_objects
from storage.settings import LakeSettings

SETTINGS = LakeSettings(s3_bucket="flywheel")


def record(key: str, name: str = "s3:ObjectCreated:Put", bucket: str = "flywheel", seq: str = "1") -> dict:
    return {"eventName": name, "s3": {"bucket": {"name": bucket}, "object": {"key": key, "sequencer": seq}}}


def test_only_new_log_files_under_landing_in_our_bucket_count():
    event = {"Records": [record("landing/a%2Bb+c.jsonl"), record("landing/x.jsonl.gz", name="ObjectCreated:Post"),
                         record("landing/notes.txt"), record("landing/a.jsonl", name="s3:ObjectRemoved:Delete"),
                         record("landing/y.jsonl", bucket="other"), record("lake/z.jsonl"),
                         record("landing/../lake/w.jsonl"), {"eventName": "s3:ObjectCreated:Put"},
                         record("landing/a%2Bb+c.jsonl", seq="2")]}
    landed = landed_objects(event, SETTINGS)
    assert landed.uris == ["s3://flywheel/landing/a+b c.jsonl", "s3://flywheel/landing/x.jsonl.gz"]
    assert landed.ignored == 7


@pytest.mark.parametrize("event", [[], {"Records": "x"}, {"EventName": "s3:ObjectCreated:Put"}, "text"])
def test_a_body_that_is_no_notification_is_an_error(event):
    with pytest.raises(EventError):
        landed_objects(event, SETTINGS)
