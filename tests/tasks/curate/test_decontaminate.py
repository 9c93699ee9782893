"""Decontamination against evaluation items (tasks/curate/decontaminate.py)."""
import pytest

from tasks.curate.decontaminate import DecontamConfig, EvalItem, build_eval_index, find_contamination

LONG = ("Maria buys three notebooks at the corner shop for four dollars each and two pens for one "
        "dollar each. She pays with a twenty dollar bill. How much change does she get back?")
SHORT = "Answer with one number. What is 17*23?"
CODE = ("Write a Python function count_vowels(s) that returns the number of vowels in the string s, "
        "ignoring case and treating y as a consonant.")
ITEMS = [
    EvalItem("math", "m-long", LONG),
    EvalItem("math", "m-short", SHORT),
    EvalItem("code", "c-1", CODE),
    EvalItem("math", "m-other", "Answer with one number. Omar has 12 apples and gives away 5. "
                                "How many apples are left?"),
]
CFG = DecontamConfig()
INDEX = build_eval_index(ITEMS, CFG)


def _check(text: str):
    found = find_contamination(["An unrelated prompt about rivers in Europe.", text], INDEX, CFG)
    assert [c.record for c in found] == [1], f"not caught: {text!r}"
    return found[0].evidence


@pytest.mark.parametrize("text, item", [
    (LONG.upper(), "m-long"),                                           # case
    ("  ".join(LONG.split()).replace(" ", "\n", 3), "m-long"),          # whitespace
    (LONG.replace(",", "").replace(".", " ;").replace("?", ""), "m-long"),  # punctuation
    (SHORT.replace("17", "１７").replace("23", "２３"), "m-short"),      # full-width digits
    (CODE.replace("(s)", " ( s ) ").replace(",", ""), "c-1"),            # punctuation in code
])
def test_each_reformatting_is_caught(text, item):
    assert _check(text)["item_id"] == item


def test_exact_match_is_reported_as_exact():
    evidence = _check("what IS 17 * 23 ?? answer with ONE number".replace("?? ", ". "))
    assert evidence["item_id"] == "m-short" and evidence["method"] in ("exact", "overlap")
    assert _check(SHORT.lower())["method"] == "exact"


def test_added_and_moved_preamble_sentences_are_caught():
    moved = "She pays with a twenty dollar bill. How much change does she get back? " + LONG.split(". ")[0]
    evidence = _check(moved)
    assert evidence["item_id"] == "m-long" and evidence["method"] == "overlap"
    assert evidence["coverage"] >= CFG.min_coverage and len(evidence["ngram"].split()) == CFG.ngram
    # a short item (no 13-gram at all): preamble added, then its sentences swapped
    assert _check("Be careful, this is for my exam!\n\n" + SHORT)["item_id"] == "m-short"
    swapped = _check("What is 17 * 23? Answer with one number, please")
    assert swapped["item_id"] == "m-short" and swapped["ngram"] == "what is 17 * 23"


def test_a_typo_that_breaks_the_ngrams_is_caught_as_near_duplicate():
    typo = CODE.replace("of vowels", "of vowles")  # mid-sentence: every 13-gram has it
    evidence = _check(typo)
    assert evidence == {"eval_set": "code", "item_id": "c-1", "method": "near_duplicate",
                        "similarity": evidence["similarity"]}
    assert evidence["similarity"] >= CFG.minhash.threshold


def test_common_words_and_shared_template_sentences_are_kept():
    clean = [
        "Maria buys a lamp at the market for twenty dollars. How much does she pay for two lamps?",
        "Answer with one number. What is 18*23?",        # the boilerplate sentence of two items
        "What is 17+23?",                                  # operator differs: another problem
        "Write a Python function that returns the number of words in the string s.",
        "Omar has 12 pears and eats 3. How many pears are left in the basket?",
    ]
    assert find_contamination(clean, INDEX, CFG) == []


def test_results_do_not_depend_on_chunking():
    texts = [LONG.lower(), "nothing to see", SHORT, CODE.upper(), "still nothing"] * 3
    whole = find_contamination(texts, INDEX, CFG)
    chunked = find_contamination(texts, INDEX, DecontamConfig(chunk=2))
    assert [(c.record, c.evidence) for c in whole] == [(c.record, c.evidence) for c in chunked]
    assert [c.record for c in whole] == [0, 2, 3, 5, 7, 8, 10, 12, 13]


def test_config_is_validated():
    with pytest.raises(ValueError, match="min_coverage"):
        DecontamConfig(min_coverage=0)
    with pytest.raises(ValueError, match="boilerplate_items"):
        DecontamConfig(boilerplate_items=1)
