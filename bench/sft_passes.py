"""The demo's warm-up step: one padded batch against length-sorted passes, same batches.

`flows/demo/sft.py: run_sft` cuts each step's pairs, sorted by length, into passes of
`SFTConfig.micro_batch`, each padded to its own longest; the loss is the mean over all
the step's answer tokens, so the step is the one padded batch's. This bench times both
ways on the same batches of the demo's additions with the demo's tiny model, each
variant in turn on every batch (so a slow moment of the machine hits both), and prints
the largest gradient difference between them on the first batch.

Measured (2026-12-06, alone on 2 cores, 25 timed steps of 128 pairs of 29-61 tokens): one
padded batch 0.457 s a step, passes of 64 0.306 s (1.49x), of 32 0.293 s (1.56x), of 16
0.311 s (1.47x); the largest gradient difference from the one batch 2.4e-7 to 2.7e-7.

    .venv/bin/python bench/sft_passes.py [--steps 25] [--batch 128]
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flows.demo.flow import addition_pairs  # noqa: E402
from flows.demo.sft import answer_loss, collate, encode_pairs, read_pairs, step_backward  # noqa: E402
from flows.demo.tiny_model import init_model  # noqa: E402


def one_batch(model, examples, pad_id) -> None:
    answer_loss(model, collate(examples, pad_id)).backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--passes-of", type=int, nargs="+", default=[64, 32, 16])
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        folder = init_model(Path(tmp) / "init")
        data = Path(tmp) / "sft.jsonl"
        data.write_text("".join(json.dumps({"prompt": p["prompt"], "completion": p["completion"]}) + "\n"
                                for p in addition_pairs(4000, 0, set())))
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
        examples = encode_pairs(tokenizer, read_pairs(data))
    lengths = sorted(len(ids) for ids, _ in examples)
    print(f"{len(examples)} pairs of {lengths[0]}-{lengths[-1]} tokens (median {lengths[len(lengths) // 2]}); "
          f"batches of {args.batch}")
    pad = tokenizer.pad_token_id
    variants = {"one padded batch": lambda b: one_batch(model, b, pad)}
    variants |= {f"passes of {n}": (lambda b, n=n: step_backward(model, b, pad, n)) for n in args.passes_of}

    first = examples[:args.batch]
    grads = {}
    for name, run in variants.items():
        model.zero_grad()
        run(first)
        grads[name] = [p.grad.clone() for p in model.parameters()]
    base = grads["one padded batch"]
    for name in list(variants)[1:]:
        diff = max((a - b).abs().max().item() for a, b in zip(grads[name], base))
        print(f"  {name}: largest gradient difference from one padded batch {diff:.1e}")

    generator, seconds = torch.Generator().manual_seed(0), dict.fromkeys(variants, 0.0)
    for step in range(args.steps + 3):  # 3 untimed warm-up steps
        batch = [examples[i] for i in torch.randperm(len(examples), generator=generator)[:args.batch].tolist()]
        for name, run in variants.items():
            model.zero_grad()
            started = time.perf_counter()
            run(batch)
            if step >= 3:
                seconds[name] += time.perf_counter() - started
    base_s = seconds["one padded batch"] / args.steps
    for name, total in seconds.items():
        print(f"{name:>18}: {total / args.steps:.3f} s a step (forward + backward), "
              f"{base_s / (total / args.steps):.2f}x one padded batch")


if __name__ == "__main__":
    main()
