import json

import pytest
from transformers import AutoTokenizer

from trainer.sft import SFTConfig, collate, encode_pairs, read_pairs, run_sft


def write_pairs(path, n=32):
    path.write_text("".join(json.dumps({"prompt": f"What is {a}+{a + 1}?", "completion": str(2 * a + 1)}) + "\n"
                            for a in range(10, 10 + n)))
    return path


def test_loss_covers_only_the_answer_and_eos(tiny_model, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    pairs = read_pairs(write_pairs(tmp_path / "d.jsonl", 2))
    (ids0, n_prompt0), ex1 = encode_pairs(tok, pairs)
    batch = collate([(ids0, n_prompt0), ex1], tok.pad_token_id)
    labelled = batch["labels"][0][batch["labels"][0] != -100].tolist()
    assert tok.decode(labelled) == "21<|im_end|>"
    assert tok.decode(ids0[:n_prompt0]).endswith("<|im_start|>assistant\n")


def test_bad_pairs_file_says_which_line(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"prompt": "x", "completion": "1"}\n{"prompt": "y"}\n')
    with pytest.raises(ValueError, match="line 2: need 'completion'"):
        read_pairs(tmp_path / "d.jsonl")


def test_sft_learns_the_answers(tiny_model, tmp_path):
    data = write_pairs(tmp_path / "d.jsonl")
    result = run_sft(tiny_model, data, tmp_path / "out", SFTConfig(steps=40, batch_size=16, lr=3e-3))
    assert result["final_loss"] < 0.5 * result["first_loss"]
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")  # tokenizer travels with the weights
    assert tok.decode(tok.encode(" a\nb", add_special_tokens=False)) == " a\nb"
