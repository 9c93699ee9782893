"""Webhook load: signed requests rejected and accepted, against Prefect's own API, same run.

    .venv/bin/python bench/webhook.py [--requests 500] [--concurrency 16]
    .venv/bin/python bench/webhook.py --webhook http://127.0.0.1:8000 --api http://127.0.0.1:4200/api \
        --secret "$FLYWHEEL_WEBHOOK_SECRET" --requests 200 --json

Without --webhook it starts a Prefect server (on an embedded PostgreSQL, as in
docker-compose), registers the deployments and starts
`flywheel webhook` on loopback, then stops them. This process is the load generator
(threads, one keep-alive connection each). Phases:
- rejected: bodies signed with a wrong secret (401), the signature check's cost;
- accepted: distinct signed bodies, each with its own Idempotency-Key (202 + a run);
- replayed: one delivery sent --requests times (one run, the rest answered from the store);
- baseline: the same runs created directly with Prefect's REST API
  (`POST /deployments/{id}/create_flow_run`), what a sender would pay without flywheel.
Afterwards every accepted run is read back: none lost, none duplicated, parameters intact.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.webhook.signatures import sign  # noqa: E402


def run_phase(requests: list[tuple[str, bytes, dict]], concurrency: int) -> dict:
    """Send (url, body, headers) requests; statuses, JSON answers, requests/s and p99 latency."""
    local = threading.local()
    latencies: list[float] = [0.0] * len(requests)
    answers: list[tuple[int, dict]] = [(0, {})] * len(requests)

    def send(i: int) -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=120)
        url, body, headers = requests[i]
        started = time.perf_counter()
        resp = local.client.post(url, content=body, headers=headers)
        latencies[i] = time.perf_counter() - started
        answers[i] = (resp.status_code, resp.json())

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(send, range(len(requests))))
    seconds = time.perf_counter() - started
    ordered = sorted(latencies)
    return {"requests": len(requests), "seconds": seconds, "rps": len(requests) / seconds,
            "p50_ms": 1000 * ordered[len(ordered) // 2],
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
            "statuses": sorted({s for s, _ in answers}), "answers": answers}


def signed(webhook: str, secret: str, payload: dict, key: str | None) -> tuple[str, bytes, dict]:
    body = json.dumps(payload).encode()
    headers = {"Flywheel-Signature": sign(secret, int(time.time()), body), "Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    return f"{webhook}/hooks/ingest", body, headers


def count_runs(api: str) -> int:
    return httpx.post(f"{api}/flow_runs/count", json={}, timeout=60).json()


def read_params(api: str, ids: list[str]) -> dict[str, dict]:
    found: dict[str, dict] = {}
    for start in range(0, len(ids), 200):
        body = {"flow_runs": {"id": {"any_": ids[start:start + 200]}}, "limit": 200}
        for run in httpx.post(f"{api}/flow_runs/filter", json=body, timeout=60).json():
            found[run["id"]] = run["parameters"]
    return found


def bench(webhook: str, api: str, secret: str, n: int, concurrency: int) -> dict:
    tag = uuid.uuid4().hex[:8]
    wrong = "not-the-secret-" + tag * 2
    rejected = run_phase([signed(webhook, wrong, {"paths": [f"s3://b/landing/r-{i}.jsonl"]}, None)
                          for i in range(n)], concurrency)
    before = count_runs(api)
    payloads = [{"paths": [f"s3://flywheel/landing/{tag}-{i}.jsonl"]} for i in range(n)]
    accepted = run_phase([signed(webhook, secret, p, f"{tag}-{i}") for i, p in enumerate(payloads)], concurrency)
    after_accepted = count_runs(api)
    replay = signed(webhook, secret, {"paths": [f"s3://flywheel/landing/{tag}-replayed.jsonl"]}, f"{tag}-replay")
    replayed = run_phase([replay] * n, concurrency)
    after_replayed = count_runs(api)
    deployment = httpx.post(f"{api}/deployments/filter", json={"deployments": {"name": {"any_": ["ingest"]}}}).json()[0]
    direct = run_phase([(f"{api}/deployments/{deployment['id']}/create_flow_run",
                         json.dumps({"parameters": p}).encode(), {"Content-Type": "application/json"})
                        for p in payloads], concurrency)
    ids = [a.get("flow_run_id") if s == 202 else None for s, a in accepted["answers"]]
    stored = read_params(api, [i for i in ids if i])
    intact = sum(1 for i, p in zip(ids, payloads) if i and stored.get(i) == p)
    distinct = len({i for i in ids if i})
    return {
        "rejected": _summary(rejected), "accepted": _summary(accepted), "replayed": _summary(replayed),
        "prefect_direct": _summary(direct),
        "runs_created_by_accepted": after_accepted - before, "distinct_run_ids": distinct,
        "runs_read_back_intact": intact, "runs_created_by_replays": after_replayed - after_accepted,
        "replay_distinct_answers": len({json.dumps(a) for _, a in replayed["answers"]}),
        "lost": n - intact, "duplicated": (after_accepted - before) - distinct,
    }


def _summary(phase: dict) -> dict:
    return {k: v for k, v in phase.items() if k != "answers"}


def start_stack(stack: ExitStack, workdir: Path, secret: str) -> tuple[str, str]:
    from tests import services
    from tests.flows.prefect_stack import register_in_process, start_prefect_on_postgres, start_webhook

    stoppers, server = start_prefect_on_postgres(workdir)
    for stop in reversed(stoppers):  # ExitStack unwinds last-in first
        stack.callback(stop)
    register_in_process(server, workdir)
    hook, url = start_webhook(server, workdir, {"FLYWHEEL_WEBHOOK_SECRET": secret,
                                                "FLYWHEEL_HOME": str(workdir / "home")})
    stack.callback(services.stop, hook)
    return url, server.api_url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--webhook", help="base URL of a running `flywheel webhook`")
    parser.add_argument("--api", help="PREFECT_API_URL of its Prefect server")
    parser.add_argument("--secret", default="bench-secret-0123456789abcdef")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()
    with ExitStack() as stack:
        webhook, api = args.webhook, args.api
        if not webhook:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flywheel-bench-")))
            webhook, api = start_stack(stack, workdir, args.secret)
        result = bench(webhook, api, args.secret, args.requests, args.concurrency)
    if args.json:
        print(json.dumps(result))
        return
    for phase in ("rejected", "accepted", "replayed", "prefect_direct"):
        r = result[phase]
        print(f"{phase:>15}: {r['rps']:8.1f} req/s  p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  "
              f"statuses {r['statuses']}")
    print(f"ratio accepted / prefect direct: {result['accepted']['rps'] / result['prefect_direct']['rps']:.2f}x req/s")
    print(f"accepted runs: created {result['runs_created_by_accepted']}, distinct ids {result['distinct_run_ids']}, "
          f"read back intact {result['runs_read_back_intact']}: lost {result['lost']}, duplicated {result['duplicated']}")
    print(f"{args.requests} replays of one delivery: {result['runs_created_by_replays']} run(s), "
          f"{result['replay_distinct_answers']} distinct answer(s)")


if __name__ == "__main__":
    main()
