"""What a model folder says about itself: context length, stop tokens, size, template.

Generation and training take these from the model, never from the toy's defaults:
- context length: `max_position_embeddings` of its config (engines cap it by config);
- stop tokens: the tokenizer's eos plus the token that ends an assistant turn in the
  chat template. That token is found by rendering a conversation and reading what the
  template writes right after the assistant's text (`<|im_end|>` for ChatML,
  `<|eot_id|>` for Llama 3, `<end_of_turn>` for Gemma), so no template is special-cased;
- parameters: summed from the safetensors headers, without loading a weight.
"""
from __future__ import annotations

import functools
import json
import struct
from dataclasses import dataclass
from pathlib import Path

_MARK = "FLYWHEEL_END_OF_ASSISTANT_TEXT"


@dataclass(frozen=True)
class ModelFacts:
    context_length: int
    stop_token_ids: tuple[int, ...]
    parameters: int
    chat_template: str | None


def read_facts(model_dir: str | Path) -> ModelFacts:
    folder = Path(model_dir).resolve()
    return _read_facts(str(folder), _stamp(folder))


def _stamp(folder: Path) -> float:
    config = folder / "config.json"
    if not config.exists():
        raise FileNotFoundError(f"{folder} is not a Hugging Face model folder: it has no config.json")
    return config.stat().st_mtime


@functools.lru_cache(maxsize=32)
def _read_facts(folder: str, _stamp: float) -> ModelFacts:
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not context:
        raise ValueError(f"{folder}/config.json gives no context length (max_position_embeddings)")
    return ModelFacts(int(context), stop_token_ids(tokenizer, Path(folder)), parameter_count(Path(folder)),
                      tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None)


def stop_token_ids(tokenizer, folder: Path | None = None) -> tuple[int, ...]:
    """eos (tokenizer and generation_config) plus the chat template's end-of-turn token."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    generation = folder / "generation_config.json" if folder else None
    if generation and generation.exists():
        eos = json.loads(generation.read_text()).get("eos_token_id")
        ids += [int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None]
    end_of_turn = template_end_of_turn(tokenizer)
    if end_of_turn is not None:
        ids.append(end_of_turn)
    return tuple(dict.fromkeys(ids))


def template_end_of_turn(tokenizer) -> int | None:
    """The special token the chat template writes right after an assistant's text."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARK}], tokenize=False)
    after = text[text.rindex(_MARK) + len(_MARK):] if _MARK in text else ""
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after.strip() else []
    special = set(tokenizer.all_special_ids)
    return next((int(i) for i in ids if i in special), None)


def parameter_count(folder: Path) -> int:
    """Sum of tensor sizes in the folder's safetensors headers (8-byte length, JSON)."""
    total = 0
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} has no *.safetensors weights (save with safe_serialization)")
    for path in files:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return total
