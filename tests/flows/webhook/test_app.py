"""flows/webhook/app.py against a real Prefect server with the ingest deployment registered.

Every rejection is checked to have created no flow run (the server's own count);
replays are checked to create exactly one.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from flows.webhook.signatures import sign
from tests import services
from tests.flows.keep_alive import answers_after_idle
from tests.flows.prefect_stack import count_runs, read_runs, register_in_process, start_webhook

OLD, NEW = "old-secret-0123456789abcdef", "new-secret-0123456789abcdef"
TOKEN = "minio-token-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[3]
ENV = {"FLYWHEEL_WEBHOOK_SECRET": f"{OLD},{NEW}", "FLYWHEEL_WEBHOOK_TOKEN": TOKEN}

# The README's example, verbatim apart from the variables the test sets.
CURL_EXAMPLE = r"""
body='{"paths": ["s3://flywheel/landing/2026-12-02/logs-000.jsonl"]}'
t=$(date +%s)
sig=$(printf '%s' "$t.$body" | openssl dgst -sha256 -hmac "$FLYWHEEL_WEBHOOK_SECRET" | sed 's/^.* //')
curl -sS -X POST "$WEBHOOK/hooks/ingest" \
  -H "Flywheel-Signature: t=$t,v1=$sig" \
  -H "Idempotency-Key: $(uuidgen 2>/dev/null || date +%s%N)" \
  -H 'Content-Type: application/json' \
  --data-binary "$body"
"""


@pytest.fixture(scope="module")
def hook(prefect_server, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("webhook")
    register_in_process(prefect_server, workdir)
    env = {**ENV, "FLYWHEEL_HOME": str(workdir / "home")}
    proc, url = start_webhook(prefect_server, workdir, env)
    state = {"proc": proc, "url": url, "workdir": workdir, "env": env}
    yield state
    services.stop(state["proc"])


def post(url: str, deployment: str, payload, secret: str = NEW, ts: int | None = None,
         headers: dict | None = None, raw: bytes | None = None) -> httpx.Response:
    body = raw if raw is not None else json.dumps(payload).encode()
    signature = sign(secret, int(time.time()) if ts is None else ts, body)
    return httpx.post(f"{url}/hooks/{deployment}", content=body, timeout=60,
                      headers={"Flywheel-Signature": signature, "Content-Type": "application/json", **(headers or {})})


def test_signed_request_creates_a_run_of_the_deployment_with_its_parameters(prefect_server, hook):
    before = count_runs(prefect_server)
    payload = {"paths": ["s3://flywheel/landing/a.jsonl"], "cycle_id": "c-1"}
    resp = post(hook["url"], "ingest", payload, secret=OLD)  # the retiring secret still works
    assert resp.status_code == 202, resp.text
    (run,) = read_runs(prefect_server, [resp.json()["flow_run_id"]])
    assert run["parameters"] == payload and "webhook" in run["tags"]
    assert count_runs(prefect_server) == before + 1


def _chunked(body: bytes):
    # a generator body makes httpx send no Content-Length (chunked): the byte count is the only guard
    for start in range(0, len(body), 65536):
        yield body[start:start + 65536]


REJECTIONS = {
    "wrong secret": (401, lambda u: post(u, "ingest", {"paths": ["x"]}, secret="not-a-secret-0123456789")),
    "tampered body": (401, lambda u: httpx.post(f"{u}/hooks/ingest", content=b'{"paths": ["y"]}', headers={
        "Flywheel-Signature": sign(NEW, int(time.time()), b'{"paths": ["x"]}')})),
    "no signature": (401, lambda u: httpx.post(f"{u}/hooks/ingest", json={"paths": ["x"]})),
    "malformed header": (401, lambda u: httpx.post(f"{u}/hooks/ingest", json={"paths": ["x"]},
                                                   headers={"Flywheel-Signature": "v1=abc"})),
    # a minute past the ±300 s window: a future stamp only 301 s ahead falls back inside it when a
    # loaded server reads its clock a second later (the exact edge is tested in test_signatures.py)
    "stale timestamp": (401, lambda u: post(u, "ingest", {"paths": ["x"]}, ts=int(time.time()) - 360)),
    "future timestamp": (401, lambda u: post(u, "ingest", {"paths": ["x"]}, ts=int(time.time()) + 360)),
    "unknown deployment": (404, lambda u: post(u, "nightly-everything", {"paths": ["x"]})),
    "not JSON": (400, lambda u: post(u, "ingest", None, raw=b"paths=x")),
    # each was a 500: a t too long for a float, a digit that is not ASCII, a string Prefect cannot send
    "400-digit timestamp": (401, lambda u: httpx.post(f"{u}/hooks/ingest", json={"paths": ["x"]},
                                                      headers={"Flywheel-Signature": "t=" + "9" * 400 + ",v1=ab"})),
    "non-ASCII digit": (401, lambda u: httpx.post(f"{u}/hooks/ingest", json={"paths": ["x"]},
                                                  headers=[(b"Flywheel-Signature", b"t=\xb2,v1=ab")])),
    "lone surrogate": (400, lambda u: post(u, "ingest", None, raw=b'{"paths": ["a\\ud800"]}')),
    "nested 5000 deep": (400, lambda u: post(u, "ingest", None, raw=b'{"paths": ' + b"[" * 5000 + b"]" * 5000 + b"}")),
    "unknown parameter": (422, lambda u: post(u, "ingest", {"paths": ["x"], "rm_rf": True})),
    "empty paths": (422, lambda u: post(u, "ingest", {"paths": []})),
    "wrong type": (422, lambda u: post(u, "ingest", {"paths": ["x"], "chunk_lines": "many"})),
    # each was coerced into a run the sender did not mean: rounds=1, rounds=3, a promotion
    "bool for a count": (422, lambda u: post(u, "flywheel-cycle", {"params": {"rounds": True}})),
    "string for a count": (422, lambda u: post(u, "flywheel-cycle", {"params": {"rounds": "3"}})),
    "number for a flag": (422, lambda u: post(u, "evaluate", {"params": {"apply_gate": 1}})),
    "JSON array": (422, lambda u: post(u, "ingest", None, raw=b'[{"paths": ["x"]}]')),
    "too large (Content-Length)": (413, lambda u: post(u, "ingest", {"paths": ["x" * (1 << 20)]})),
    "too large (chunked)": (413, lambda u: httpx.post(f"{u}/hooks/ingest", content=_chunked(b"x" * (2 << 20)),
                                                      headers={"Flywheel-Signature": "t=1,v1=00"})),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_rejected_request_answers_its_status_and_creates_nothing(prefect_server, hook, case):
    status, send = REJECTIONS[case]
    before = count_runs(prefect_server)
    resp = send(hook["url"])
    assert resp.status_code == status, resp.text
    assert "detail" in resp.json()
    assert count_runs(prefect_server) == before


def test_a_thousand_concurrent_replays_create_exactly_one_run(prefect_server, hook):
    before = count_runs(prefect_server)
    body = json.dumps({"paths": ["s3://flywheel/landing/replayed.jsonl"]}).encode()
    headers = {"Flywheel-Signature": sign(NEW, int(time.time()), body), "Idempotency-Key": "delivery-1000"}

    def send(client: httpx.Client) -> tuple[int, str]:
        resp = client.post(f"{hook['url']}/hooks/ingest", content=body, headers=headers)
        return resp.status_code, resp.json().get("flow_run_id", "")

    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=32)) as client, \
            ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda _: send(client), range(1000)))
    assert {status for status, _ in answers} == {202}
    assert len({run_id for _, run_id in answers}) == 1
    assert count_runs(prefect_server) == before + 1


def test_an_idle_connection_outlives_pooled_clients_expiry(hook):
    """Longer idle than uvicorn's default keep-alive (5 s): still answered, not reset."""
    assert answers_after_idle(hook["url"], "/healthz", idle_s=6)


def test_a_key_reused_with_another_body_is_refused(prefect_server, hook):
    key = {"Idempotency-Key": "reused-key"}
    assert post(hook["url"], "ingest", {"paths": ["s3://b/landing/1.jsonl"]}, headers=key).status_code == 202
    before = count_runs(prefect_server)
    resp = post(hook["url"], "ingest", {"paths": ["s3://b/landing/2.jsonl"]}, headers=key)
    assert resp.status_code == 422 and "different body" in resp.text
    assert count_runs(prefect_server) == before


def test_a_verbatim_replay_without_a_key_creates_nothing(prefect_server, hook):
    body = json.dumps({"paths": ["s3://flywheel/landing/captured.jsonl"]}).encode()
    headers = {"Flywheel-Signature": sign(NEW, int(time.time()), body)}
    first = httpx.post(f"{hook['url']}/hooks/ingest", content=body, headers=headers)
    before = count_runs(prefect_server)
    again = httpx.post(f"{hook['url']}/hooks/ingest", content=body, headers=headers)
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert count_runs(prefect_server) == before


def test_a_restarted_webhook_remembers_deliveries(prefect_server, hook):
    key = {"X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"}
    payload = {"paths": ["s3://flywheel/landing/before-restart.jsonl"]}
    first = post(hook["url"], "ingest", payload, headers=key)
    assert first.status_code == 202
    services.stop(hook["proc"])
    hook["proc"], hook["url"] = start_webhook(prefect_server, hook["workdir"], hook["env"])
    before = count_runs(prefect_server)
    again = post(hook["url"], "ingest", payload, headers=key)  # re-signed: a sender's retry
    assert again.status_code == 202 and again.json() == first.json()
    assert count_runs(prefect_server) == before


def minio_event(*records: tuple[str, str, str]) -> dict:
    """The shape MinIO posts to a webhook target (keys URL-encoded)."""
    return {"EventName": "s3:ObjectCreated:Put", "Key": "flywheel/landing", "Records": [
        {"eventVersion": "2.0", "eventSource": "minio:s3", "eventName": name,
         "s3": {"s3SchemaVersion": "1.0", "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
                "object": {"key": key, "size": 10, "eTag": "e", "sequencer": f"seq-{key}"}}}
        for name, bucket, key in records]}


def test_s3_events_ingest_exactly_the_new_landing_objects(prefect_server, hook):
    event = minio_event(("s3:ObjectCreated:Put", "flywheel", "landing/day+1/logs%20a.jsonl"),
                        ("s3:ObjectCreated:CompleteMultipartUpload", "flywheel", "landing/b.jsonl.gz"),
                        ("s3:ObjectCreated:Put", "flywheel", "lake/data.parquet"),
                        ("s3:ObjectRemoved:Delete", "flywheel", "landing/c.jsonl"),
                        ("s3:ObjectCreated:Put", "other-bucket", "landing/d.jsonl"))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    before = count_runs(prefect_server)
    resp = httpx.post(f"{hook['url']}/hooks/s3-events", json=event, headers=auth)
    assert resp.status_code == 202, resp.text
    (run,) = read_runs(prefect_server, [resp.json()["flow_run_id"]])
    assert run["parameters"] == {"paths": ["s3://flywheel/landing/day 1/logs a.jsonl",
                                           "s3://flywheel/landing/b.jsonl.gz"]}
    redelivered = httpx.post(f"{hook['url']}/hooks/s3-events", json=event, headers=auth)
    assert redelivered.json() == resp.json()
    assert count_runs(prefect_server) == before + 1


def test_s3_events_without_landing_objects_or_credentials_create_nothing(prefect_server, hook):
    before = count_runs(prefect_server)
    unrelated = minio_event(("s3:ObjectCreated:Put", "flywheel", "reports/x.png"))
    ok = httpx.post(f"{hook['url']}/hooks/s3-events", json=unrelated, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json() == {"flow_run_id": None, "ignored": 1}
    landing = minio_event(("s3:ObjectCreated:Put", "flywheel", "landing/e.jsonl"))
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": f"Basic {TOKEN}"}):
        assert httpx.post(f"{hook['url']}/hooks/s3-events", json=landing, headers=headers).status_code == 401
    assert count_runs(prefect_server) == before


def test_the_readme_curl_example_triggers_a_run(prefect_server, hook):
    before = count_runs(prefect_server)
    done = subprocess.run(["bash", "-c", CURL_EXAMPLE], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "FLYWHEEL_WEBHOOK_SECRET": NEW, "WEBHOOK": hook["url"]})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["flow_run_id"]
    assert count_runs(prefect_server) == before + 1


def test_load_from_a_second_process_loses_and_duplicates_nothing(prefect_server, hook):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "webhook.py"), "--webhook", hook["url"],
                           "--api", prefect_server.api_url, "--secret", NEW, "--requests", "60",
                           "--concurrency", "8", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rejected"]["statuses"] == [401] and result["accepted"]["statuses"] == [202]
    assert result["lost"] == result["duplicated"] == 0 and result["runs_read_back_intact"] == 60
    assert result["runs_created_by_replays"] == 1 and result["replay_distinct_answers"] == 1
    print({phase: (round(result[phase]["rps"], 1), round(result[phase]["p99_ms"], 1))
           for phase in ("rejected", "accepted", "replayed", "prefect_direct")})


def test_the_cycle_is_triggered_with_validated_options(prefect_server, hook):
    before = count_runs(prefect_server)
    assert post(hook["url"], "flywheel-cycle", {"params": {"rounds": 0}}).status_code == 422
    assert post(hook["url"], "flywheel-cycle", {"rounds": 2}).status_code == 422
    assert count_runs(prefect_server) == before
    resp = post(hook["url"], "flywheel-cycle", {"params": {"rounds": 2, "cycle_id": "from-webhook"}})
    assert resp.status_code == 202, resp.text
    (run,) = read_runs(prefect_server, [resp.json()["flow_run_id"]])
    assert run["parameters"] == {"params": {"rounds": 2, "cycle_id": "from-webhook"}}


def test_an_evaluation_is_triggered_with_validated_options(prefect_server, hook):
    before = count_runs(prefect_server)
    assert post(hook["url"], "evaluate", {"params": {"eval_samples": 0}}).status_code == 422
    assert post(hook["url"], "evaluate", {"params": {"policy_version": ""}}).status_code == 422
    assert post(hook["url"], "evaluate", {"policy_version": "abc"}).status_code == 422  # not under "params"
    assert count_runs(prefect_server) == before
    resp = post(hook["url"], "evaluate", {"params": {"policy_version": "abc", "apply_gate": True}})
    assert resp.status_code == 202, resp.text
    (run,) = read_runs(prefect_server, [resp.json()["flow_run_id"]])
    assert run["parameters"] == {"params": {"policy_version": "abc", "apply_gate": True}}
    assert run["deployment_id"] is not None and count_runs(prefect_server) == before + 1
