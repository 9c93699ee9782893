"""Supervised warm start on (prompt, reference solution) pairs.

GRPO learns only from groups whose samples disagree; a randomly initialised policy is
never right, so every group would be dropped. A short SFT on reference solutions makes
the policy right sometimes. The loss covers the answer tokens (and the closing eos)
only: the prompt is given, not something to imitate. A plain single-process torch loop
on purpose: the warm start is small and runs before any rollout; the distributed
machinery belongs to GRPO.

Data file: JSON lines, each `{"prompt": "<user message>", "completion": "<answer>"}`
or `{"messages": [chat turns...], "completion": "<answer>"}`.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.job import copy_tokenizer_files


@dataclass(frozen=True)
class SFTConfig:
    steps: int = 250
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    # Linear warm-up, then cosine decay to lr * min_lr_ratio: with a constant rate the
    # tiny model's answer loss plateaus high (noisy steps at the end of training).
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    seed: int = 0
    # Stop early once greedy decoding answers this share of the held-out pairs exactly
    # (checked every `eval_every` steps; `steps` is then the cap). A small model learns
    # some skills abruptly (the tiny demo model goes from 9% to 61% of additions between
    # steps 500 and 750), so a fixed step count lands on either side of the jump.
    target_accuracy: float | None = None
    eval_every: int = 25
    # A step's pairs, sorted by length, are cut into forward passes of this many, each padded
    # to its own longest; the loss is still the mean over all the step's answer tokens, so
    # the step is the one a single padded batch takes. The demo's additions are 35-61 tokens:
    # one pass of 128 pads ~30% of them away, and 4 passes of 32 made a step 0.48 -> 0.33 s
    # (alone on 2 cores; ~0.44 -> 0.37 s inside the demo).
    micro_batch: int = 32

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.micro_batch < 1:
            raise ValueError("SFTConfig.steps, batch_size and micro_batch must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"SFTConfig.lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("SFTConfig.warmup_steps must be >= 0 and min_lr_ratio in [0, 1]")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"SFTConfig.target_accuracy must be in (0, 1], got {self.target_accuracy}")
        if self.eval_every < 1:
            raise ValueError("SFTConfig.eval_every must be >= 1")

    def lr_at(self, step: int) -> float:
        """Learning rate of optimiser step `step` (0-based)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(self.steps - self.warmup_steps, 1)
        floor = self.lr * self.min_lr_ratio
        return floor + (self.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def read_pairs(path: str | Path) -> list[dict]:
    """Load and check the pairs; each gets `messages` (the prompt as chat turns)."""
    pairs = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row.get("completion"), str) or not ("prompt" in row or "messages" in row):
            raise ValueError(f"{path} line {i + 1}: need 'completion' (text) and 'prompt' or 'messages'")
        messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
        pairs.append({"messages": messages, "completion": row["completion"]})
    if not pairs:
        raise ValueError(f"{path} holds no training pairs")
    return pairs


def encode_pairs(tokenizer, pairs: list[dict]) -> list[tuple[list[int], int]]:
    """(prompt + answer + eos ids, number of prompt ids) for each pair."""
    encoded = []
    for pair in pairs:
        prompt = tokenizer.apply_chat_template(pair["messages"], add_generation_prompt=True, tokenize=False)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a_ids = tokenizer(pair["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        encoded.append((p_ids + a_ids, len(p_ids)))
    return encoded


def collate(examples: list[tuple[list[int], int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded inputs; labels are -100 (ignored) on the prompt and the padding."""
    length = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), length), -100, dtype=torch.long)
    attention = torch.zeros((len(examples), length), dtype=torch.long)
    for i, (ids, n_prompt) in enumerate(examples):
        input_ids[i, :len(ids)] = torch.tensor(ids)
        labels[i, n_prompt:len(ids)] = torch.tensor(ids[n_prompt:])
        attention[i, :len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}


def greedy_accuracy(model, batch: dict[str, torch.Tensor]) -> float:
    """Share of pairs that greedy decoding answers exactly (answer and eos).

    One teacher-forced forward pass: greedy decoding reproduces the answer exactly when
    the argmax after every prefix of it is its next token, which is what this checks.
    """
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    model.train(was_training)
    labels = batch["labels"][:, 1:]
    hit = (logits[:, :-1].argmax(-1) == labels) | (labels == -100)
    return hit.all(dim=1).float().mean().item()


def answer_loss(model, batch: dict[str, torch.Tensor], reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over answer tokens, their mean or sum (labels shifted: logits at t predict t+1)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), batch["labels"][:, 1:].reshape(-1),
        ignore_index=-100, reduction=reduction)


def step_backward(model, examples: list[tuple[list[int], int]], pad_id: int, micro_batch: int) -> float:
    """Backward of the mean answer-token loss over `examples`, in length-sorted passes of
    `micro_batch` (gradients accumulate); the loss."""
    ordered = sorted(examples, key=lambda e: len(e[0]))
    answer_tokens = sum(len(ids) - n_prompt for ids, n_prompt in ordered)
    total = 0.0
    for start in range(0, len(ordered), micro_batch):
        loss = answer_loss(model, collate(ordered[start:start + micro_batch], pad_id), "sum") / answer_tokens
        loss.backward()
        total += loss.item()
    return total


def run_sft(model_dir: str | Path, data: str | Path, out_dir: str | Path, cfg: SFTConfig = SFTConfig(),
            held_out: str | Path | None = None) -> dict:
    """Train, save the model (with the base tokenizer) to out_dir, return loss figures.

    held_out: pairs (same format as data) that cfg.target_accuracy is measured on; with a
    target they are required, and they must not be training pairs.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).train()
    examples = encode_pairs(tokenizer, read_pairs(data))
    if cfg.target_accuracy is not None and held_out is None:
        raise ValueError("SFTConfig.target_accuracy needs held-out pairs to measure it on")
    check = collate(encode_pairs(tokenizer, read_pairs(held_out)), tokenizer.pad_token_id) if held_out else None
    accuracy = None
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    order: list[int] = []
    losses = []
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr_at(step)
        if len(order) < cfg.batch_size:  # a fresh permutation per epoch, appended
            order += torch.randperm(len(examples), generator=gen).tolist()
        idx, order = order[:cfg.batch_size], order[cfg.batch_size:]
        optimizer.zero_grad()
        losses.append(step_backward(model, [examples[i] for i in idx], tokenizer.pad_token_id, cfg.micro_batch))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if check is not None and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            accuracy = greedy_accuracy(model, check)
            if cfg.target_accuracy is not None and accuracy >= cfg.target_accuracy:
                break
    seconds = time.perf_counter() - t0
    out_dir = Path(out_dir)
    model.save_pretrained(str(out_dir))
    copy_tokenizer_files(Path(model_dir), out_dir)
    return {"steps": len(losses), "first_loss": losses[0], "final_loss": sum(losses[-10:]) / len(losses[-10:]),
            "seconds": seconds, "examples": len(examples), "held_out_accuracy": accuracy}
