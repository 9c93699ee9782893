import json

from transformers import AutoTokenizer

from flows.demo.tokenizer import ALPHABET, IM_END, build_tokenizer


def test_round_trip_keeps_spaces_newlines_and_code():
    tok = build_tokenizer()
    text = "def f(x):\n    return x  +  1\n\n# {\"a\": [1, 2]} ~`|\\"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one id per character
    assert tok.decode(ids) == text


def test_unknown_characters_become_unk():
    tok = build_tokenizer()
    ids = tok.encode("a\u00e9b", add_special_tokens=False)
    assert ids[1] == tok.unk_token_id and tok.unk_token_id not in tok.encode(ALPHABET, add_special_tokens=False)


def test_chat_template_markers_are_single_tokens():
    tok = build_tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": "hi there"}], add_generation_prompt=True,
                                   tokenize=False)
    assert text == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.eos_token_id) == 1 and tok.convert_ids_to_tokens(tok.eos_token_id) == IM_END
    assert len(ids) == len("user\nhi there\n") + len("assistant\n") + 3


def test_saved_folder_reloads_with_autotokenizer(tiny_model):
    config = json.loads((tiny_model / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    tok = AutoTokenizer.from_pretrained(tiny_model)
    text = "  two  spaces\nand a newline "
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<pad>", "<s>")
    assert tok.chat_template is not None
