"""The gateway's cost: calls through `flywheel gateway` against calls to `vllm serve` directly.

One run starts `vllm serve` of a model and the gateway in front of it (logging on: every
call committed to the spool before its response is released, shipping by age), then sends
the same calls both ways with the `openai` SDK at the same concurrency, in alternating
blocks so drift on a shared 2-core machine hits both alike. Prints p50 and p99 latency,
calls per second, and what the gateway adds; and what recording a call's metrics costs
(flows/gateway/metrics.py), timed alone, as a share of what the gateway adds.
`--metrics-only` times that alone, as a share of `--overhead-ms` (the gateway's p50 added
on this machine, measured by a full run).

    .venv/bin/python bench/gateway.py [--model tiny|smollm2] [--calls 400] [--concurrency 8]
    .venv/bin/python bench/gateway.py --metrics-only [--overhead-ms 6]
"""

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import openai  # noqa: E402

from flows.demo.tiny_model import init_model  # noqa: E402
from flows.gateway.metrics import GatewayMetrics  # noqa: E402
from flows.gateway.vllm_serve import ServedModel  # noqa: E402
from tests.flows.gateway.conftest import KEY, shipped_records, start_gateway  # noqa: E402
from trainer.model_import import convert, resolve_source  # noqa: E402


def timed_calls(base_url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> list[float]:
    """Latency in seconds of each call, `concurrency` in flight at once."""
    client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=120)

    def one(prompt: str) -> float:
        start = time.perf_counter()
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                       max_tokens=max_tokens, temperature=0, seed=0)
        return time.perf_counter() - start

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, prompts))


def metrics_cost_s(calls: int = 50000) -> float:
    """Seconds the gateway's metrics take for one answered call, as calls.py and app.py
    record it: a meter made, its version, stream, first event and usage set, then ended
    (the call counter, the latency and first-byte histograms, the two token counters)."""
    metrics, usage = GatewayMetrics(), {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}
    best = float("inf")
    for _ in range(5):  # the best of five: the shared machine's noise only ever adds
        start = time.perf_counter()
        for i in range(calls):
            meter = metrics.call("chat")
            meter.stream = i % 3 == 0
            meter.version = "v-canary" if i % 10 == 0 else "v-primary"
            meter.sending()
            meter.usage = usage
            meter.end(200)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def print_metrics_cost(overhead_s: float, what: str) -> None:
    cost = metrics_cost_s()
    print(f"metrics: {cost * 1e6:.1f} us a call = {cost / overhead_s:.2%} of {what} ({overhead_s * 1000:.1f} ms)")


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", choices=("tiny", "smollm2"))
    parser.add_argument("--calls", type=int, default=400, help="calls each way (bounded)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks each way")
    parser.add_argument("--metrics-only", action="store_true", help="time the metrics' recording alone")
    parser.add_argument("--overhead-ms", type=float, default=6.0, help="with --metrics-only: the p50 the "
                        "gateway adds here, from a full run")
    args = parser.parse_args()
    if args.metrics_only:
        print_metrics_cost(args.overhead_ms / 1000, "--overhead-ms")
        return
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-gateway-") as tmp:
        tmp = Path(tmp)
        model = (init_model(tmp / "model") if args.model == "tiny"
                 else convert(resolve_source("smollm2"), tmp / "model", "float32"))
        served = ServedModel.start(model, "bench", tmp / "logs", max_model_len=512).wait_ready(600)
        gateway = start_gateway(tmp / "home", served.url)
        try:
            prompts = [f"What is {i}+{i * 7 % 13}?" for i in range(args.calls)]
            timed_calls(f"{served.url}/v1", "bench", prompts[:16], args.concurrency, args.max_tokens)  # warm-up
            timed_calls(f"{gateway.url}/v1", "flywheel", prompts[:16], args.concurrency, args.max_tokens)
            per_block = args.calls // args.blocks
            direct, through, direct_s, through_s = [], [], 0.0, 0.0
            for b in range(args.blocks):
                block = prompts[b * per_block:(b + 1) * per_block]
                start = time.perf_counter()
                direct += timed_calls(f"{served.url}/v1", "bench", block, args.concurrency, args.max_tokens)
                direct_s += time.perf_counter() - start
                start = time.perf_counter()
                through += timed_calls(f"{gateway.url}/v1", "flywheel", block, args.concurrency, args.max_tokens)
                through_s += time.perf_counter() - start
        finally:
            gateway.stop()
            served.stop()
        logged = sum(r["type"] == "call" for r in shipped_records(tmp / "home" / "landing"))
    print(f"model {args.model}, {len(direct)} calls each way, concurrency {args.concurrency}, "
          f"max_tokens {args.max_tokens}; calls logged and shipped through the gateway: {logged}")
    print(f"{'':10} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>8}")
    for name, lat, secs in (("direct", direct, direct_s), ("gateway", through, through_s)):
        print(f"{name:10} {percentile(lat, 50) * 1000:8.1f} {percentile(lat, 99) * 1000:8.1f} {len(lat) / secs:8.1f}")
    print(f"gateway adds p50 {(percentile(through, 50) - percentile(direct, 50)) * 1000:+.1f} ms, "
          f"p99 {(percentile(through, 99) - percentile(direct, 99)) * 1000:+.1f} ms; "
          f"throughput ratio gateway/direct {(len(through) / through_s) / (len(direct) / direct_s):.2f}")
    print_metrics_cost(percentile(through, 50) - percentile(direct, 50), "the gateway's p50 added")


if __name__ == "__main__":
    main()
