"""What a model folder says about itself: context length, stop tokens, size, template.

Generation and training take these from the model, never from the toy's defaults:
- context length: `max_position_embeddings` of its config (engines cap it by config);
- stop tokens: the tokenizer's eos plus the token that ends an assistant turn in the
  chat template. That token is found by rendering a conversation and reading what the
  template writes right after the assistant's text (`<|im_end|>` for ChatML,
  `<|eot_id|>` for Llama 3, `<end_of_turn>` for Gemma), so no template is special-cased;
- generation prompt: a template must end a prompt where the assistant's text starts; one
  that ignores `add_generation_prompt` (and writes no opening itself) is refused;
- parameters: summed from the safetensors headers of the files transformers loads (the
  index's shards, else model.safetensors), without loading a weight; a file shorter than
  its header says (a copy cut short) is refused here rather than when a job loads it.
"""
from __future__ import annotations

import functools
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

_MARK = "FLYWHEEL_END_OF_ASSISTANT_TEXT"
NO_STOP_TOKEN = ("no stop token: the tokenizer has no eos_token and the chat template writes no special token "
                 "after an assistant's turn, so no completion would stop before its budget; set eos_token "
                 "in tokenizer_config.json")


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
    try:
        context = context_length(config)
    except ValueError as exc:
        raise ValueError(f"{folder}: {exc}") from None
    stops = stop_token_ids(tokenizer, Path(folder))
    if not stops:  # every completion would run to its budget and be judged cut off
        raise ValueError(f"{folder}: {NO_STOP_TOKEN}")
    problem = generation_prompt_problem(tokenizer)
    if problem:
        raise ValueError(f"{folder}: {problem}")
    return ModelFacts(context, stops, parameter_count(Path(folder)), default_template(tokenizer))


def default_template(tokenizer) -> str | None:
    """The template a chat request is rendered with: a tokenizer with named templates
    (Hermes, Command-R: "default", "tool_use", ...) renders "default"."""
    template = tokenizer.chat_template
    if isinstance(template, dict):
        return template.get("default")
    return template if isinstance(template, str) else None


def context_length(config) -> int:
    """The longest sequence the model's config says it takes."""
    context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not context:
        raise ValueError(f"config.json gives no context length (max_position_embeddings); the {config.model_type} "
                         "architecture may not have one: flywheel needs it to size prompts and completions")
    return int(context)


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
    from jinja2 import TemplateError

    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARK}], tokenize=False)
    except (TemplateError, ValueError) as exc:  # the template's own raise_exception, a bad filter, no default
        raise ValueError(f"the chat template cannot render a user and an assistant turn, so no chat request "
                         f"could be: {exc}") from exc
    after = text[text.rindex(_MARK) + len(_MARK):] if _MARK in text else ""
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after.strip() else []
    special = set(tokenizer.all_special_ids)
    return next((int(i) for i in ids if i in special), None)


def generation_prompt_problem(tokenizer) -> str | None:
    """Why a prompt would not end where the assistant's text starts, or None.

    A template that ignores `add_generation_prompt` ends every prompt after the user's
    turn, so the policy is asked to continue the user's turn: it writes the assistant's
    opening itself, or ends at once, and every sample is judged on that. Seen by rendering
    a user turn both ways (the same text: the switch is ignored) and then with an assistant
    turn: what precedes the assistant's text beyond that prompt is the opening it lacks.
    Only whitespace may: Llama 2's and Mistral's prompts end at `[/INST]`, the answer after
    a space. A generation prompt that differs (Qwen3's, DeepSeek-R1's think tags) is the
    template's own choice and is not judged here.
    """
    if not getattr(tokenizer, "chat_template", None):
        return None
    from jinja2 import TemplateError

    user = [{"role": "user", "content": "hi"}]
    try:
        prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
        bare = tokenizer.apply_chat_template(user, add_generation_prompt=False, tokenize=False)
        turn = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": _MARK}], tokenize=False)
    except (TemplateError, TypeError, ValueError):  # nothing to judge by; prompts are checked one by one
        return None
    if prompt != bare or _MARK not in turn or not turn.startswith(prompt):
        return None
    opening = turn[len(prompt):turn.index(_MARK)]
    if not opening.strip():
        return None
    return (f"the chat template ignores add_generation_prompt: a prompt ends before the assistant's turn "
            f"opens ({opening!r} is missing), so the model would go on with the user's turn; fix the "
            "template's `{% if add_generation_prompt %}` branch")


def parameter_count(folder: Path) -> int:
    """Sum of tensor sizes in the headers of the folder's weight files (weight_files)."""
    return sum(math.prod(shape) for shape in weight_shapes(folder).values())


def weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's name and shape, from the headers of the folder's weight files."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in weight_files(folder):
        shapes.update(_header_shapes(path))
    return shapes


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files transformers loads: the index's shards, else model.safetensors.
    Not every *.safetensors: Mistral's releases keep the original `consolidated.safetensors`
    beside the HF shards, the same weights again."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"{index} is not a safetensors index (no weight_map): {exc}") from exc
        missing = [name for name in shards if not (folder / name).is_file()]
        if missing:
            raise ValueError(f"{index} names shards the folder lacks: {', '.join(missing)}")
        return [folder / name for name in shards]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} has no *.safetensors weights (save with safe_serialization)")
    return files


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """One safetensors file's tensors (8-byte header length, JSON header, data), checked
    against the file's size: its last tensor must end where the file does."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                raise ValueError(f"its header says {length} bytes")
            header = json.loads(f.read(length))
        tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
        end = max((entry["data_offsets"][1] for entry in tensors.values()), default=0)
        shapes = {name: tuple(int(d) for d in entry["shape"]) for name, entry in tensors.items()}
    except (struct.error, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ValueError(f"{path} is not a safetensors file: {exc}") from exc
    if 8 + length + end > size:
        raise ValueError(f"{path} is truncated: its header needs {8 + length + end} bytes, the file has "
                         f"{size}; copy it again")
    return shapes
