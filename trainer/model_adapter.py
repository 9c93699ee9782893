"""Bring a LoRA-tuned model: a PEFT adapter folder merged into its base at import.

A model fine-tuned with LoRA (or another PEFT method that merges: LoHa, LoKr, IA3, ...)
often exists only as an adapter (`adapter_config.json`, `adapter_model.safetensors`)
over a base model. flywheel serves and trains plain folders (vLLM loads the policy by
path and reloads its weights every round; the trainer's own LoRA merges its adapters
into each candidate), so an adapter is merged into its base once, by
trainer.model_import.convert, and stored as the plain folder that results.

The merge is PEFT's own (`merge_and_unload`) in float32, the stored dtype chosen after.
An adapter whose tensors do not all land in the base (another architecture, another
size, modules the base lacks) is refused rather than merged in part: PEFT only warns
about adapter tensors it could not place, and a model missing part of its tuning would
be imported silently. Prompt and prefix tuning add virtual tokens at run time and have
no merged form: refused.

Deliberately not here: finding the base. Which folder, file or lake model is the base is
the caller's (tasks.release.models.import_model, `flywheel model import --base`).
"""
from __future__ import annotations

import json
from pathlib import Path

from trainer.model_import import ModelImportError

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter(path: Path) -> bool:
    """A PEFT adapter folder: its config, and no model config beside it."""
    return path.is_dir() and (path / ADAPTER_CONFIG).exists() and not (path / "config.json").exists()


def adapter_base_name(adapter: Path) -> str | None:
    """The base the adapter was trained on, as its config names it (a hub id or a path)."""
    name = read_adapter_config(adapter).get("base_model_name_or_path")
    return name if isinstance(name, str) and name else None


def read_adapter_config(adapter: Path) -> dict:
    path = adapter / ADAPTER_CONFIG
    try:
        config = json.loads(path.read_bytes())
    except ValueError as exc:  # JSONDecodeError, and bytes that are no text
        raise ModelImportError(f"{path} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ModelImportError(f"{path} must be a JSON object, got a JSON {type(config).__name__}")
    return config


def has_tokenizer(adapter: Path) -> bool:
    """Whether the adapter ships its own tokenizer (one trained with added tokens or a new
    chat template does): then it, not the base's, is the model's tokenizer."""
    return (adapter / "tokenizer_config.json").exists()


def merge_adapter(model, adapter: Path, vocab_size: int):
    """`model` (a float32 causal LM) with `adapter` merged in: a plain model again."""
    from peft import PeftConfig, PeftModel

    try:
        config = PeftConfig.from_pretrained(str(adapter))
    except (ValueError, TypeError, KeyError) as exc:  # an unknown peft_type, a field of no known config
        raise ModelImportError(f"{adapter}: PEFT cannot read its {ADAPTER_CONFIG}: {exc}") from exc
    if config.is_prompt_learning:
        raise ModelImportError(f"{adapter}: a {config.peft_type.value} adapter adds virtual tokens at run time "
                               "and has no merged form; flywheel imports adapters PEFT merges (LoRA and its kin)")
    if vocab_size > model.get_input_embeddings().num_embeddings:
        # An adapter trained with added tokens saves its resized embeddings (modules_to_save):
        # the base grows to its tokenizer first, as PEFT's docs load such an adapter.
        model.resize_token_embeddings(vocab_size)
    try:
        wrapped = PeftModel(model, config)
    except ValueError as exc:  # "Target modules {...} not found in the base model"
        raise ModelImportError(f"{adapter}: the adapter does not fit the base model: {exc}") from exc
    _load_weights(wrapped, adapter, config)
    return wrapped.merge_and_unload()


def _load_weights(wrapped, adapter: Path, config) -> None:
    """The adapter's tensors into the wrapped model, every one of them placed."""
    from peft.mapping import PEFT_TYPE_TO_PREFIX_MAPPING
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    try:
        weights = load_peft_weights(str(adapter), device="cpu")
    except (OSError, ValueError) as exc:  # no adapter_model.*, or a file safetensors cannot read
        raise ModelImportError(f"{adapter}: its adapter weights cannot be read: {exc}") from exc
    try:
        result = set_peft_model_state_dict(wrapped, weights)
    except RuntimeError as exc:  # "size mismatch for ...": an adapter of another size of the model
        raise ModelImportError(f"{adapter}: the adapter does not fit the base model: {exc}") from exc
    prefix = PEFT_TYPE_TO_PREFIX_MAPPING.get(config.peft_type, "")
    missing = [k for k in result.missing_keys if prefix and prefix in k]
    unplaced = list(result.unexpected_keys) + missing
    if unplaced:
        raise ModelImportError(f"{adapter}: {len(unplaced)} adapter tensors do not match the base model "
                               f"(first: {unplaced[0]}); is the base the model it was trained on?")
