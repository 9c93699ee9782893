"""Normal forms, content hashes and bulk tokenisation (tasks/curate/similarity/normalize.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tasks.curate.similarity.normalize import content_hash, normalize_strong, normalize_text, strong_tokens, tokenize_batch

ROOT = Path(__file__).resolve().parents[4]


def test_normal_form_folds_case_whitespace_and_full_width():
    assert normalize_text("  What IS\t１７×２３?\n") == "what is 17×23?"
    assert normalize_text("ﬁle Straße") == "file strasse"
    assert content_hash("What is 17*23?") == content_hash("what  is １７*２３?")
    assert content_hash("What is 17*23?") != content_hash("What is 17*24?")
    assert len(content_hash("x")) == 64 and int(content_hash("x"), 16) >= 0


def test_strong_form_drops_punctuation_but_keeps_operators():
    assert normalize_strong("Hello, world!!  (really?)") == "hello world really"
    assert normalize_strong("What is 17*23?") == normalize_strong("what is 17 * 23")
    assert normalize_strong("What is 17*23?") != normalize_strong("What is 17+23?")
    assert strong_tokens("snake_case well-known “quoted” — dash") == [
        "snake", "case", "well", "known", "quoted", "dash"]


def test_tokenize_batch_agrees_with_strong_tokens():
    texts = ["What is １７*23?  Please,\tanswer!", "Ünïcode — “quotes” café_bar x-1 ＡＢＣ", "",
             "a\x00b", "ß straße ﬁle", "日本語のテキスト。次の文！", "x" * 3000 + " y"]
    batch = tokenize_batch(texts)
    assert batch.lengths.tolist() == [len(strong_tokens(t)) for t in texts]
    for i, text in enumerate(texts):
        # the same tokens written plainly hash identically, in a batch of their own
        plain = tokenize_batch([" ".join(strong_tokens(text))])
        assert np.array_equal(batch.hashes[batch.offsets[i]:batch.offsets[i + 1]], plain.hashes)
    words = tokenize_batch(["alpha beta", "beta alpha"])
    assert words.hashes[0] == words.hashes[3] and words.hashes[0] != words.hashes[1]


def test_span_hashes_depend_only_on_the_words():
    batch = tokenize_batch(["one two three four", "zero one two three", "one two"])
    grams, doc = batch.span_hashes(3)
    assert doc.tolist() == [0, 0, 1, 1]  # no span crosses a text boundary
    assert grams[0] == grams[3]  # "one two three" in both texts
    assert batch.whole_hashes()[2] == batch.span_hashes(2)[0][0]


def _hashes_in_fresh_interpreter() -> dict:
    code = ("import json; from tasks.curate.similarity.normalize import content_hash, tokenize_batch;"
            "b = tokenize_batch(['What is 17*23?', 'Straße ﬁle ４２']);"
            "print(json.dumps({'id': content_hash('What is 17*23?'),"
            " 'tokens': [int(h) for h in b.hashes], 'spans': [int(h) for h in b.span_hashes(2)[0]]}))")
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)


def test_ids_and_hashes_are_stable_across_processes():
    first, second = _hashes_in_fresh_interpreter(), _hashes_in_fresh_interpreter()
    assert first == second
    here = tokenize_batch(["What is 17*23?", "Straße ﬁle ４２"])
    assert first["tokens"] == [int(h) for h in here.hashes]
    assert first["id"] == content_hash("what is 17*23?")


def test_hashes_do_not_change_between_versions():
    # persisted MinHash signatures (scheme minhash-v1) are built on these exact values;
    # a faster implementation must reproduce them bit for bit
    batch = tokenize_batch(["What is 17*23?", "Straße ﬁle ４２"])
    assert [int(h) for h in batch.hashes[:3]] == [8411067409259128436, 2178267691657697384, 13481880165588719284]
    assert int(batch.span_hashes(2)[0][0]) == 5879011042378933162


def _python_run_hash(tokens: list[int]) -> int:
    """The documented run hash, on Python ints: mix64(sum t_j B^j + m L) mod 2^64."""
    mask = (1 << 64) - 1
    poly = sum(t * pow(0xC2B2AE3D27D4EB4F, j, 1 << 64) for j, t in enumerate(tokens))
    z = (poly + len(tokens) * 0x165667B19E3779F9) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_every_way_of_hashing_a_run_agrees():
    words = " ".join(f"w{i % 23}" for i in range(60))
    batch = tokenize_batch(["x", words, "a b", "", words[::-1]])
    tokens = [int(h) for h in batch.hashes]
    for m in (1, 2, 5, 16, 17, 40):  # Horner up to 16 tokens, prefix sums beyond
        grams, doc, starts = batch.spans(m)
        assert [int(g) for g in grams] == [_python_run_hash(tokens[s:s + m]) for s in starts.tolist()]
        assert all(batch.offsets[d] <= s and s + m <= batch.offsets[d + 1] for d, s in zip(doc, starts))
    whole = [_python_run_hash(tokens[a:b]) for a, b in zip(batch.offsets[:-1], batch.offsets[1:])]
    assert [int(h) for h in batch.whole_hashes()] == whole


def test_large_batches_hash_like_single_texts():
    # ~600 KiB of text: token hashing runs over several byte windows
    texts = [f"Prompt {i}: what is {i}*{i + 7}? Explain {'step ' * (i % 40)}carefully, ＡＢＣ." for i in range(6000)]
    batch = tokenize_batch(texts)
    for i in range(0, 6000, 97):
        alone = tokenize_batch([texts[i]])
        assert np.array_equal(batch.hashes[batch.offsets[i]:batch.offsets[i + 1]], alone.hashes)
