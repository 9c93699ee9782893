import json

import pytest
from transformers import AutoTokenizer

from flows.demo.sft import SFTConfig, collate, encode_pairs, read_pairs, run_sft


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


def test_a_step_in_length_sorted_passes_is_the_one_padded_batch(tiny_model, tmp_path):
    """Cut into passes, each padded to its own longest, a step has the loss and gradient
    of the whole batch padded to its longest (mean over all its answer tokens)."""
    import torch
    from transformers import AutoModelForCausalLM

    from flows.demo.sft import answer_loss, step_backward

    tok = AutoTokenizer.from_pretrained(tiny_model)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": "What is " + " plus ".join(map(str, range(2 + i % 7))) + "?",
                                        "completion": str(sum(range(2 + i % 7))) * (1 + i % 3)}) + "\n"
                            for i in range(11)))
    examples = encode_pairs(tok, read_pairs(data))
    assert len({len(ids) for ids, _ in examples}) > 4  # passes of different lengths
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    whole = answer_loss(model, collate(examples, tok.pad_token_id))
    whole.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss = step_backward(model, examples, tok.pad_token_id, micro_batch=3)
    assert loss == pytest.approx(whole.item(), abs=1e-5)
    for got, want in zip((p.grad for p in model.parameters()), expected):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)


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


def test_greedy_accuracy_matches_greedy_decoding(tiny_model, tmp_path):
    """The one-pass check agrees with actually decoding greedily, pair by pair."""
    import torch
    from transformers import AutoModelForCausalLM

    from flows.demo.sft import greedy_accuracy

    data = write_pairs(tmp_path / "d.jsonl", 24)
    run_sft(tiny_model, data, tmp_path / "out", SFTConfig(steps=25, batch_size=16, lr=3e-3))
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    pairs = read_pairs(data)
    right = []
    for ids, n_prompt in encode_pairs(tok, pairs):
        out = model.generate(torch.tensor([ids[:n_prompt]]), max_new_tokens=len(ids) - n_prompt + 2,
                             do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        right.append(out[0, n_prompt:].tolist()[:len(ids) - n_prompt] == ids[n_prompt:])
    assert 0 < sum(right) < len(right), "the check is only informative on a partly trained model"
    batch = collate(encode_pairs(tok, pairs), tok.pad_token_id)
    assert greedy_accuracy(model, batch) == pytest.approx(sum(right) / len(right))


def test_sft_stops_at_the_target_accuracy(tiny_model, tmp_path):
    data = write_pairs(tmp_path / "d.jsonl")
    cfg = SFTConfig(steps=400, batch_size=16, lr=3e-3, target_accuracy=0.5, eval_every=5)
    result = run_sft(tiny_model, data, tmp_path / "out", cfg, held_out=data)
    assert result["held_out_accuracy"] >= 0.5
    assert result["steps"] < 400 and result["steps"] % 5 == 0
    with pytest.raises(ValueError, match="needs held-out pairs"):
        run_sft(tiny_model, data, tmp_path / "out2", cfg)
