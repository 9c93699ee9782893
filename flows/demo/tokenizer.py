"""Character-level tokenizer for the tiny demo model, built locally (no hub download).

The alphabet is fixed rather than learned from a corpus so that every demo task (math,
code, JSON) is encodable by construction and two builds give identical ids. It holds
the ASCII digits, letters and punctuation, the space, the newline and the tab; any
other character becomes `<unk>`. Chat turns use a ChatML-like template whose markers
are special tokens, so a marker is one id and never spelled out character by character.

Saved with `tokenizer_class: PreTrainedTokenizerFast`: a model-specific class (e.g.
Qwen2Tokenizer) would re-normalise the text and silently drop spaces and newlines.
This module does not train a subword vocabulary; real models bring their own tokenizer.
"""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n\t"
PAD, BOS, UNK = "<pad>", "<s>", "<unk>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, BOS, UNK, IM_START, IM_END)

# The generation prompt ends after "assistant\n"; the model's answer then ends with
# <|im_end|>, which is also eos, so generation stops exactly at the end of a turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_vocab() -> dict[str, int]:
    """Special tokens first (ids 0-4), then the alphabet in its fixed order."""
    return {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(ALPHABET))}


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = build_vocab()
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Split every character into its own piece; WordLevel then maps it to its id.
    # (?m) is Oniguruma's dot-all: "." matches newlines: without it a run of newlines stays one unknown piece.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    # Fuse joins pieces with no separator, so decode(encode(s)) == s for spaces too.
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=4096,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    tokenizer.save_pretrained(str(out_dir))
