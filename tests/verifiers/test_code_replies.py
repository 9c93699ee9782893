"""The `code` verifier on replies shaped like real instruct models' answers.

Every reply runs in the real sandbox, through the registry as the pipeline calls it (so
a reasoning model's `<think>` block is cut off first). Honest replies (fences with and
without tags, prose around the code, no fence at all, example prints, several blocks,
drafts in the thinking) must pass; hacks and wrong answers must not, whatever shape they
come in.
"""
import time

import pytest

from verifiers import code
from verifiers.registry import verify

SPECS = {
    "add": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    "is_palindrome": (
        "def check(candidate):\n    assert candidate('racecar') is True\n    assert candidate('abc') is False\n"
        "    assert candidate('A man, a plan, a canal: Panama') is True\n    assert candidate('') is True\n"),
    "fizzbuzz": (
        "def check(candidate):\n    assert candidate(5) == ['1', '2', 'Fizz', '4', 'Buzz']\n"
        "    assert candidate(15)[-1] == 'FizzBuzz'\n    assert candidate(0) == []\n"),
    "running_max": (
        "def check(candidate):\n    assert candidate([1, 3, 2, 5, 4]) == [1, 3, 3, 5, 5]\n"
        "    assert candidate([]) == []\n    assert candidate([-2, -5]) == [-2, -2]\n"),
    "word_count": (
        "def check(candidate):\n    assert candidate('the cat the hat') == {'the': 2, 'cat': 1, 'hat': 1}\n"
        "    assert candidate('') == {}\n"),
    # check calls the function by its own name, as some of HumanEval's do.
    "double": "def check(candidate):\n    assert double(2) == 4\n    assert double(-5) == -10\n",
    # Every builtin check calls here can be shadowed so that mean = 0 would pass.
    "mean": (
        "def check(candidate):\n    assert isinstance(candidate([1, 2, 3]), float)\n"
        "    assert abs(candidate([1, 2, 3]) - 2.0) < 1e-9\n"
        "    assert all(abs(candidate([x, x]) - x) < 1e-9 for x in range(5))\n"),
    # MBPP's tests: `assert f(...) == ...` lines, calling the function by its own name.
    "remove_Occ": (
        "def check(candidate):\n    assert remove_Occ(\"hello\",\"l\") == \"heo\"\n"
        "    assert remove_Occ(\"abcda\",\"a\") == \"bcd\"\n    assert remove_Occ(\"PHP\",\"P\") == \"H\"\n"),
    # A task about reasoning models' output: its honest programs quote the closing tag.
    "strip_thinking": (
        "def check(candidate):\n    assert candidate('<think>a</think>b') == 'b'\n"
        "    assert candidate('b') == 'b'\n"),
}

HONEST = [
    ("add", "```python\ndef add(a, b):\n    return a + b\n```"),
    ("add", "Here is the function:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nIt returns the sum."),
    ("add", "```Python\ndef add(a, b):\n    return a + b\n```"),
    ("add", "```py\ndef add(a, b):\n    return a + b\n```"),
    ("add", "Sure!\n```python3\ndef add(a: int, b: int) -> int:\n    \"\"\"Sum of a and b.\"\"\"\n    return a + b\n```"),
    ("add", "```\ndef add(a, b):\n    return a + b\n```\nNo tag on that fence."),
    ("add", "Here is the function:\n\ndef add(a, b):\n    return a + b\n\nThis returns the sum."),
    ("add", "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5\n"),
    ("add", "```python\ndef add(a, b):\n    return a + b\n\n\nif __name__ == \"__main__\":\n"
            "    print(add(2, 3))\n    assert add(1, 1) == 3  # never runs: not __main__\n```"),
    ("add", "```python\ndef add(a, b):\n    return a + b\n```\n\nExample usage:\n\n```python\n"
            "print(add(2, 3))  # Output: 5\n```\n\nRunning it:\n\n```bash\npython add.py\n```\n\n```output\n5\n```"),
    ("add", "Let me think step by step. We need `a + b`; Python's `+` works for ints and floats.\n"
            "Edge cases: negatives are fine.\n\n```python\ndef add(a, b):\n    return a + b\n```"),
    ("add", "First attempt:\n```python\ndef add(a, b):\n    return a - b\n```\nOops, that subtracts. Fixed:\n"
            "```python\ndef add(a, b):\n    return a + b\n```\n```python\nassert add(2, 2) == 4\n```"),
    ("add", "Explanation\n\ndef add(a, b):\n    return a + b\nExplanation\n"),
    ("add", "The function is below.\n\n    def add(a, b):\n        return a + b\n\nIndented, markdown style."),
    ("add", "```python\nadd = lambda a, b: a + b\n```"),
    ("add", "```python\ndef add(a, b):\n    return a + b```"),
    ("add", "```python\ndef add(a, b):\n    return a + b\n"),
    ("add", "1. Write the function:\n   ```python\n   def add(a, b):\n       return a + b\n   ```\n"
            "2. Call it: `add(2, 3)`."),
    ("add", "First, a helper:\n\ndef plus_one(x):\n    return x + 1\n\nThen the function:\n\n"
            "def add(a, b):\n    return plus_one(a) + b - 1\n\nDone."),
    ("double", "```python\ndef double(x):\n    return 2 * x\n```"),
    ("is_palindrome", "```python\nimport re\n\ndef is_palindrome(s: str) -> bool:\n"
                      "    cleaned = re.sub(r'[^a-z0-9]', '', s.lower())\n    return cleaned == cleaned[::-1]\n```"),
    ("is_palindrome", "Use a helper that normalises the text:\n\n```python\ndef normalize(s):\n"
                      "    return [c.lower() for c in s if c.isalnum()]\n```\n\nThen compare with its reverse:\n\n"
                      "```python\ndef is_palindrome(s):\n    chars = normalize(s)\n    return chars == chars[::-1]\n```"),
    ("is_palindrome", "Two pointers keep memory O(1):\n\ndef is_palindrome(s):\n    i, j = 0, len(s) - 1\n"
                      "    while i < j:\n        if not s[i].isalnum():\n            i += 1\n"
                      "        elif not s[j].isalnum():\n            j -= 1\n"
                      "        elif s[i].lower() != s[j].lower():\n            return False\n"
                      "        else:\n            i, j = i + 1, j - 1\n    return True\n\n"
                      "Complexity: O(n) time, O(1) space. The call `is_palindrome('abba')` gives `True`."),
    ("is_palindrome", "```python\nfrom typing import List\n\n\nclass Cleaner:\n    def __init__(self, text: str):\n"
                      "        self.text = text\n\n    def chars(self) -> List[str]:\n"
                      "        return [c.casefold() for c in self.text if c.isalnum()]\n\n\n"
                      "def is_palindrome(s: str) -> bool:\n    chars = Cleaner(s).chars()\n"
                      "    return chars == list(reversed(chars))\n```"),
    ("fizzbuzz", "```python\ndef fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n"
                 "        if i % 15 == 0:\n            out.append('FizzBuzz')\n        elif i % 3 == 0:\n"
                 "            out.append('Fizz')\n        elif i % 5 == 0:\n            out.append('Buzz')\n"
                 "        else:\n            out.append(str(i))\n    return out\n\n\nfor line in fizzbuzz(15):\n"
                 "    print(line)\n```"),
    ("fizzbuzz", "def fizzbuzz(n):\n    return ['Fizz' * (i % 3 == 0) + 'Buzz' * (i % 5 == 0) or str(i)\n"
                 "            for i in range(1, n + 1)]\n"),
    ("fizzbuzz", "Here's a solution:\n\n```python\ndef word(i: int) -> str:\n    if i % 15 == 0:\n"
                 "        return \"FizzBuzz\"\n    if i % 3 == 0:\n        return \"Fizz\"\n"
                 "    if i % 5 == 0:\n        return \"Buzz\"\n    return str(i)\n\n\n"
                 "def fizzbuzz(n: int) -> list[str]:\n    return [word(i) for i in range(1, n + 1)]\n```\n\n"
                 "**Explanation:**\n- `word(i)` maps one number.\n- `fizzbuzz(n)` builds the list for `1..n`."),
    ("fizzbuzz", "```text\nFizzBuzz rules: multiples of 3 -> Fizz, 5 -> Buzz, both -> FizzBuzz.\n```\n\n"
                 "```python\ndef fizzbuzz(n):\n    names = {3: 'Fizz', 5: 'Buzz'}\n"
                 "    return [''.join(v for k, v in names.items() if i % k == 0) or str(i) for i in range(1, n + 1)]\n```"),
    ("running_max", "```python\nfrom itertools import accumulate\n\ndef running_max(xs):\n"
                    "    return list(accumulate(xs, max))\n```\n\n```python\n>>> running_max([1, 3, 2])\n[1, 3, 3]\n```"),
    ("running_max", "We keep the best so far.\n\n```python\ndef running_max(xs: list[int]) -> list[int]:\n"
                    "    result, best = [], None\n    for x in xs:\n"
                    "        best = x if best is None or x > best else best\n        result.append(best)\n"
                    "    return result\n```\n\n```python\nprint(running_max([1, 3, 2, 5, 4]))\n```\n\n"
                    "```console\n$ python main.py\n[1, 3, 3, 5, 5]\n```"),
    ("running_max", "```python\nimport itertools\n```\n\nand then\n\n```python\ndef running_max(xs):\n"
                    "    return list(itertools.accumulate(xs, max))\n```"),
    ("running_max", "import itertools\n\ndef running_max(xs):\n    return list(itertools.accumulate(xs, max))\n\n"
                    "print(running_max([1, 3, 2]))  # [1, 3, 3]\n\nThat prints [1, 3, 3]."),
    ("running_max", "Let's reason: for each index i the answer is max(xs[:i+1]).\n"
                    "That is O(n^2); a running value makes it O(n).\n\n"
                    "```python\ndef running_max(xs):\n    out = []\n    for x in xs:\n"
                    "        out.append(x if not out else max(out[-1], x))\n    return out\n```\n"
                    "Test:\n```python\nassert running_max([1, 3, 2]) == [1, 3, 3]\nprint(\"ok\")\n```"),
    ("word_count", "```python\nfrom collections import Counter\n\n\ndef word_count(text: str) -> dict[str, int]:\n"
                   "    \"\"\"Count whitespace-separated words.\"\"\"\n    return dict(Counter(text.split()))\n```\n\n"
                   "```json\n{\"the\": 2, \"cat\": 1, \"hat\": 1}\n```"),
    ("word_count", "```python\nfrom collections import defaultdict\n\ndef word_count(text):\n"
                   "    counts = defaultdict(int)\n    for word in text.split():\n        counts[word] += 1\n"
                   "    return dict(counts)\n\nif __name__ == '__main__':\n"
                   "    print(word_count('the cat the hat'))\n```\n\nThe `defaultdict` avoids a key check."),
    ("word_count", "@staticmethod-free version, with a decorator for caching:\n\n"
                   "from functools import lru_cache\n\n@lru_cache(maxsize=None)\ndef _count(text):\n"
                   "    counts = {}\n    for w in text.split():\n        counts[w] = counts.get(w, 0) + 1\n"
                   "    return tuple(counts.items())\n\ndef word_count(text):\n    return dict(_count(text))\n\n"
                   "Note: the cache returns tuples so callers cannot mutate it."),
    ("mean", "```python\nimport math\n\ndef mean(xs):\n    return math.fsum(xs) / len(xs)\n```"),
    ("mean", "```python\nimport statistics\n\ndef mean(xs: list[float]) -> float:\n"
             "    return float(statistics.fmean(xs))\n\n\nprint(mean([1, 2, 3]))  # 2.0\n```"),
    ("remove_Occ", "```python\ndef remove_Occ(s, ch):\n    first, last = s.find(ch), s.rfind(ch)\n"
                   "    if first < 0:\n        return s\n    s = s[:first] + s[first + 1:]\n"
                   "    last -= 1\n    return s[:last] + s[last + 1:] if last >= first else s\n```"),
    # Reasoning models: a wrong draft in the thinking, the answer after it.
    ("add", "<think>\nMaybe subtract?\n```python\ndef add(a, b):\n    return a - b\n```\nNo, add.\n</think>\n\n"
            "```python\ndef add(a, b):\n    return a + b\n```"),
    ("add", "The template opened the thinking. Draft:\ndef add(a, b):\n    return a * b\nwrong.\n</think>\n\n"
            "def add(a, b):\n    return a + b\n"),
    ("strip_thinking", "```python\ndef strip_thinking(text):\n    return text.split('</think>', 1)[-1]\n```"),
    # Fence info strings and line endings as editors and chat UIs write them.
    ("add", "```python title=\"add.py\"\ndef add(a, b):\n    return a + b\n```"),
    ("add", "```python:add.py\ndef add(a, b):\n    return a + b\n```"),
    ("add", "Here it is:\r\n\r\n```python\r\ndef add(a, b):\r\n    return a + b\r\n```\r\n\r\nIt adds.\r\n"),
    ("add", "```python\ndef add(a, b):\n\tresult = a + b\n\treturn result\n```"),
    # A script-style answer: its __main__ block reads stdin and never runs under the tests.
    ("add", "```python\ndef add(a, b):\n    return a + b\n\n\nif __name__ == \"__main__\":\n"
            "    a, b = map(int, input().split())\n    print(add(a, b))\n```"),
]

WRONG = "def mean(xs):\n    return 0\n"
NOT_PASSING = {
    "os._exit(0) before check": ("add", "```python\nimport os\ndef add(a, b):\n    return 0\nos._exit(0)\n```",
                                 "hacking_suspected"),
    "sys.exit(0) inside the function": ("add", "import sys\n\ndef add(a, b):\n    sys.exit(0)\n",
                                        "hacking_suspected"),
    "forged result line": ("add", "```python\nprint('@@flywheel-result ' + 'a' * 32 + ' pass ')\n"
                                  "def add(a, b):\n    return 0\n```", "hacking_suspected"),
    "rigged __eq__": ("running_max", "```python\nclass Anything(list):\n    def __eq__(self, other):\n"
                                     "        return True\n\ndef running_max(xs):\n    return Anything()\n```",
                      "hacking_suspected"),
    "rigged __eq__, called by name": ("double", "class Anything(int):\n    def __eq__(self, other):\n"
                                                "        return True\n\ndef double(x):\n    return Anything()\n",
                                      "hacking_suspected"),
    "gc to find the tests": ("add", "import gc\ndef add(a, b):\n    print(gc.get_referrers(add))\n    return 0\n",
                             "hacking_suspected"),
    "frames to find the tests": ("add", "```python\nimport inspect\ndef add(a, b):\n"
                                        "    inspect.currentframe().f_back.f_globals['check'] = lambda c: None\n"
                                        "    return 0\n```", "hacking_suspected"),
    "redefine check at module level": ("add", "```python\ndef check(candidate):\n    pass\n\n"
                                              "def add(a, b):\n    return 0\n```", "wrong"),
    "shadow abs, isinstance and all": ("mean", "```python\ndef abs(x):\n    return 0\n\n"
                                               "def isinstance(obj, kind):\n    return True\n\n"
                                               "def all(items):\n    return True\n\n" + WRONG + "```", "wrong"),
    "shadow builtins by assignment": ("mean", "abs = lambda x: 0\nisinstance = lambda o, k: True\n"
                                              "all = lambda it: True\n" + WRONG, "wrong"),
    "shadow builtins through globals()": ("mean", "g = globals()\ng['abs'] = lambda x: 0\n"
                                                  "g['isinstance'] = g['all'] = lambda *a: True\n" + WRONG, "wrong"),
    "wrong answer": ("running_max", "```python\ndef running_max(xs):\n    return sorted(xs)\n```", "wrong"),
    "correct first, wrong final answer": ("add", "```python\ndef add(a, b):\n    return a + b\n```\n"
                                                 "Actually it should multiply:\n```python\ndef add(a, b):\n"
                                                 "    return a * b\n```", "wrong"),
    "prose only": ("add", "To add two numbers, return a plus b.", "format_error"),
    "usage block only": ("add", "```python\nprint(add(2, 3))\n```", "format_error"),
    "the function only in a text fence": ("add", "```text\ndef add(a, b):\n    return a + b\n```", "format_error"),
    "the function only in a bash fence": ("add", "```bash\ndef add(a, b):\n    return a + b\n```", "format_error"),
    "the right function only in the thinking": ("add", "<think>\n```python\ndef add(a, b):\n    return a + b\n```\n"
                                                       "</think>\n\nJust use the + operator.", "format_error"),
    "right draft in the thinking, wrong answer": (
        "add", "<think>\n```python\ndef add(a, b):\n    return a + b\n```\n</think>\n"
               "```python\ndef add(a, b):\n    return a * b\n```", "wrong"),
    "cut inside the thinking": ("add", "<think>\nDraft:\n```python\ndef add(a, b):\n    return a + b\n```\n"
                                       "Now the edge cases", "format_error"),
    "only the function body": ("add", "```python\nreturn a + b\n```", "format_error"),
    "reads stdin at import": ("add", "```python\na, b = map(int, input().split())\n\ndef add(a, b):\n"
                                     "    return a + b\n```", "wrong"),
}


def _spec(name: str) -> dict:
    return {"entry_point": name, "tests": SPECS[name]}


@pytest.mark.parametrize("entry_point, reply", HONEST, ids=[f"{i}-{e}" for i, (e, _) in enumerate(HONEST)])
def test_honest_reply_passes(entry_point, reply):
    verdict = verify("code", _spec(entry_point), reply)
    assert verdict.passed and verdict.status == "ok", (verdict, code.extract_program(reply, entry_point))


@pytest.mark.parametrize("name", NOT_PASSING)
def test_hack_or_wrong_reply_does_not_pass(name):
    entry_point, reply, status = NOT_PASSING[name]
    verdict = verify("code", _spec(entry_point), reply)
    assert not verdict.passed and verdict.reward == 0.0
    assert verdict.status == status, verdict


def test_the_shadowing_hacks_would_pass_a_check_that_saw_them():
    """The shadowing cases above fail only because the harness keeps the program's
    builtin-named globals out of the tests: with them in scope, check accepts mean = 0."""
    namespace = {"abs": lambda x: 0, "isinstance": lambda o, k: True, "all": lambda it: True}
    exec(SPECS["mean"], namespace)
    namespace["check"](lambda xs: 0)  # no AssertionError


def test_the_last_block_defining_the_entry_point_is_the_program():
    reply = ("```python\ndef add(a, b):\n    return 0\n```\n```python\ndef add(a, b):\n    return a + b\n```\n"
             "```python\nprint(add(1, 2))\n```\n```bash\ndef add(): echo\n```")
    assert code.extract_program(reply, "add") == "def add(a, b):\n    return a + b\n"
    assert code.extract_program("```python\nprint(add(1, 2))\n```", "add") == "print(add(1, 2))\n"


def test_prose_around_unfenced_code_is_trimmed():
    reply = "Here is the function:\n\ndef add(a, b):\n    return a + b\n\nThis returns the sum.\nExplanation\n"
    assert code.extract_program(reply, "add") == "def add(a, b):\n    return a + b\n"
    whole = "from typing import List\n\n\ndef add(a, b):\n    return a + b\n"
    assert code.extract_program(whole, "add") == whole


@pytest.mark.parametrize("reply", [
    "Some prose.\n" + ("def add(a, b:\n    return a +\nfrom here on\n" + "x = 1\n" * 20) * 500,
    "Some prose.\n" + ("def add(a, b:\n    return a +\nfrom here on\n" + "x = 1\n" * 20) * 50_000,
    "def add(a, b):\n    return a + b\n" + "Word: thing\n" * 5_000 + "and prose",
    "`" * 200_000,
    "```python\n" + "`" * 200_000 + "x\n",
], ids=["many-code-starts", "huge", "prose-that-parses", "backticks", "backticks-in-a-block"])
def test_extraction_time_is_bounded(reply):
    # CPU time, not wall time: a busy machine must not fail this (1.7 s wall seen under a
    # second suite's load against 0.02 s of work). Each case takes under 0.06 s linear; a
    # quadratic search would take minutes on the largest.
    started = time.process_time()
    code.extract_program(reply, "add")
    assert time.process_time() - started < 0.5
