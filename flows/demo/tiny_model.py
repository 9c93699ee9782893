"""The tiny demo policy: a randomly initialised Llama plus the character tokenizer.

`init_model` writes an ordinary Hugging Face folder (config, safetensors weights,
tokenizer, chat template, generation config) that `AutoModelForCausalLM`,
`AutoTokenizer` and vLLM load like any downloaded model, so the rest of the pipeline
never knows the policy is tiny. A Llama config is used on purpose: the Qwen2 family
would bring `Qwen2Tokenizer`, which drops spaces and newlines from our vocabulary.
Not here: loading real checkpoints (any Hugging Face folder is used as is).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from flows.demo.tokenizer import build_tokenizer, save_tokenizer


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the tiny Llama. Defaults give ~1.06M parameters."""

    hidden_size: int = 128
    intermediate_size: int = 512
    # 4 layers, not 2: after 400 SFT steps on 2-digit additions, 2 layers reached 11%
    # greedy held-out accuracy (loss 0.83), 4 layers 43% (loss 0.45); carrying needs depth.
    num_hidden_layers: int = 4
    num_attention_heads: int = 2
    # Longest prompt + completion the model (and vLLM's max_model_len) accepts, in
    # characters (one token each). 512, not 256: a demo code request is ~250 characters at
    # the median and ~330 at p90, and a working function ~105 and ~195 more. RoPE learns
    # no per-position weights, so the parameters, and what SFT makes of them, are unchanged.
    max_position_embeddings: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"ModelConfig.hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_attention_heads ({self.num_attention_heads}); change either one")


def init_model(out_dir: Path, cfg: ModelConfig = ModelConfig()) -> Path:
    """Build the tiny model and tokenizer and save both into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_attention_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        # Tied embeddings halve the parameter count of a vocabulary-heavy tiny model.
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(str(out_dir))
    save_tokenizer(tokenizer, out_dir)
    pin_tokenizer_class(out_dir)
    return out_dir


def pin_tokenizer_class(model_dir: Path) -> None:
    """Record the generic fast tokenizer class, readable by transformers 4 and 5 alike.

    transformers 5 writes its internal name `TokenizersBackend`, which older
    transformers (as shipped with some GPU vLLM builds) cannot resolve.
    """
    path = Path(model_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2) + "\n")


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())
