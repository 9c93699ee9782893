"""How much supervised training does the tiny demo model need to write the demo's functions?

In the demo, code failures go to the `sft` route (no sample passes), and their references
train inside the GRPO job: 80 steps a cycle at GRPO's learning rate (3e-5), each adding
`sft_coef` (0.1) x the NLL of `sft_per_step` (8) references. The tiny model's code failure rate
stays at 100% after 3 cycles. This bench asks what it would take: plain supervised
training of the demo's warm-started model on code references (mixed with the additions
it already knows, so the damage to them shows), at a given learning rate, measuring at
checkpoints the share of held-out code tasks and held-out additions that greedy decoding
reproduces exactly (teacher-forced argmax: exact reproduction of the reference, a lower
bound on passing its tests); at the end, greedy replies to the held-out code tasks are
scored by the code verifier in its sandbox, as the pipeline scores them. Held-out code tasks are sampled with another seed and share
no (prompt, solution) pair with the training ones.

Measured (2026-12-05, /tmp/fw-routing3, defaults, 15 minutes alone on 2 cores): exact
reproduction 0% of held-out code at steps 100-500, 1.1% at 600; in the sandbox 3 of 179
pass (6 wrong, 170 format errors); held-out additions 57% -> 7% (step 100) -> 25% (600).
With `--steps 2000 --every 400` (2026-12-06, 71 minutes, a second job on the cores for
part of it): exact 0% at 400, 10.6% at 800, 46.9% at 1200, 52.0% at 1600, 50.8% at 2000;
in the sandbox 77 of 179 pass (38 wrong, 61 format errors, 3 timeouts); additions 22% at
400, back to 49.5% at 2000. The tiny model can write the demo's functions: the dose is
what the demo lacks.

    .venv/bin/python bench/code_sft.py .flywheel/demo [--lr 1e-3] [--steps 600] [--batch 32]

(the argument: a tiny `flywheel demo` home; its `models/sft` is the warm-started model and
its `sft.jsonl` / `sft-held-out.jsonl` the additions it was warmed on).
"""

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flows.demo.data.code import sample_code  # noqa: E402
from flows.demo.sft import answer_loss, collate, encode_pairs, greedy_accuracy, read_pairs  # noqa: E402


def code_tasks(n: int, seed: int, exclude: set = frozenset()) -> list[dict]:
    rng, tasks = random.Random(seed), []
    while len(tasks) < n:
        task = sample_code(rng)
        if (task["prompt"], task["gold"]) not in exclude:
            tasks.append(task)
    return tasks


def as_pairs(tasks: list[dict]) -> list[dict]:
    return [{"messages": [{"role": "user", "content": t["prompt"]}], "completion": t["gold"]} for t in tasks]


def sandbox_passes(model, tokenizer, tasks: list[dict], max_tokens: int) -> Counter:
    """Greedy replies to the tasks, scored by the code verifier in its sandbox."""
    from verifiers.code import verify

    model.eval()
    statuses = Counter()
    with torch.no_grad():
        for task in tasks:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": task["prompt"]}],
                                                   add_generation_prompt=True, tokenize=False)
            ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
            room = min(max_tokens, model.config.max_position_embeddings - ids.shape[1])
            out = model.generate(ids, max_new_tokens=room, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
            reply = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            statuses[verify(task["reference"], reply).status] += 1
    model.train()
    return statuses


def fits(examples: list, limit: int) -> list:
    """The pairs whose prompt and reference fit the model's context."""
    return [e for e in examples if len(e[0]) <= limit]


def accuracy(model, examples: list, pad_id: int, chunk: int = 64) -> float:
    hits = sum(greedy_accuracy(model, collate(examples[i:i + chunk], pad_id)) * len(examples[i:i + chunk])
               for i in range(0, len(examples), chunk))
    return hits / len(examples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("home", type=Path)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--train-tasks", type=int, default=2000)
    ap.add_argument("--held-out", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=160, help="reply budget (the demo's code budget)")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(2)
    model_dir = args.home / "models" / "sft"
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).train()
    limit = model.config.max_position_embeddings
    train = code_tasks(args.train_tasks, seed=1)
    held_out = code_tasks(args.held_out, seed=2, exclude={(t["prompt"], t["gold"]) for t in train})
    code_train = fits(encode_pairs(tokenizer, as_pairs(train)), limit)
    encoded = encode_pairs(tokenizer, as_pairs(held_out))
    held_out = [t for t, e in zip(held_out, encoded) if len(e[0]) <= limit]
    code_check = fits(encoded, limit)
    add_train = encode_pairs(tokenizer, read_pairs(args.home / "sft.jsonl"))
    add_check = encode_pairs(tokenizer, read_pairs(args.home / "sft-held-out.jsonl"))[:args.held_out]
    pad = tokenizer.pad_token_id
    print(f"{len(code_train)} code pairs to train on, {len(code_check)} held out (context {limit}); "
          f"lr {args.lr}, batch {args.batch} (half code, half additions)")
    print(f"step 0: code {accuracy(model, code_check, pad):.3f}, additions {accuracy(model, add_check, pad):.3f}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rng, t0 = random.Random(0), time.perf_counter()
    for step in range(1, args.steps + 1):
        half = args.batch // 2
        batch = collate(rng.sample(code_train, half) + rng.sample(add_train, args.batch - half), pad)
        loss = answer_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.every == 0 or step == args.steps:
            print(f"step {step}: loss {loss.item():.3f}, code {accuracy(model, code_check, pad):.3f}, "
                  f"additions {accuracy(model, add_check, pad):.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    statuses = sandbox_passes(model, tokenizer, held_out, args.max_tokens)
    print(f"held-out code tasks, greedy replies ({args.max_tokens} tokens) in the sandbox: "
          f"{statuses['ok']}/{sum(statuses.values())} pass; {dict(statuses.most_common())}")


if __name__ == "__main__":
    main()
