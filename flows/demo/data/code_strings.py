"""Demo code-task families over strings and text parsing.

A family is a small Python function users ask for: candidate names and argument names,
descriptions, a known-good source, a typical buggy source, and inputs for the tests.
Sources are `string.Template`s: `$name` is the function name, `$a0`/`$a1` the argument
names, `$k`/`$m` the family's parameters. The edge inputs are chosen so the buggy
source fails on them; tests/flows/demo/test_data.py proves both claims by running them.
"""
import random

WORDS = (
    "apple", "river", "Stone", "cloud", "tiger", "level", "Noon", "green", "paper", "radar",
    "window", "banana", "Orbit", "planet", "garden", "moon", "data", "Quick", "brown", "fox",
    "lazy", "dog", "python", "Kayak", "engine", "silver", "table", "music", "ocean", "Bridge",
)


def text(rng: random.Random, lo: int = 1, hi: int = 5) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def family(names, args, desc, src, bug, inputs, edges, params=None, failure=("test_failed", "AssertionError")):
    return {"names": names, "args": args, "desc": desc, "src": src, "bug": bug, "inputs": inputs,
            "edges": edges, "params": params or (lambda rng: {}), "failure": failure}


_TEXT_ARGS = (("s",), ("text",), ("line",))

STRING_FAMILIES = (
    family(("count_vowels", "vowel_count", "num_vowels"), _TEXT_ARGS,
           ("returns the number of vowels (a, e, i, o, u) in $a0, ignoring case",
            "counts how many vowels $a0 contains, upper or lower case"),
           "def $name($a0):\n    return sum(1 for ch in $a0.lower() if ch in 'aeiou')\n",
           "def $name($a0):\n    return sum(1 for ch in $a0 if ch in 'aeiou')\n",
           lambda rng, p: (text(rng),), [("",), ("AEIOU and Y",)]),
    family(("reverse_words", "reverse_word_order", "flip_words"), _TEXT_ARGS,
           ("returns the words of $a0 in reverse order joined by single spaces, dropping extra whitespace",
            "reverses the order of the words in $a0 (words are separated by whitespace)"),
           "def $name($a0):\n    return ' '.join(reversed($a0.split()))\n",
           "def $name($a0):\n    return $a0[::-1]\n",
           lambda rng, p: (text(rng, 2, 6),), [("",), ("  hello   world ",)]),
    family(("is_palindrome", "palindrome_check", "reads_same_backwards"), _TEXT_ARGS,
           ("returns True if $a0 reads the same forwards and backwards, ignoring case and any character that is not a letter or digit",
            "checks whether $a0 is a palindrome when only letters and digits are compared, case-insensitively"),
           "def $name($a0):\n    cleaned = [ch.lower() for ch in $a0 if ch.isalnum()]\n    return cleaned == cleaned[::-1]\n",
           "def $name($a0):\n    return $a0 == $a0[::-1]\n",
           lambda rng, p: (rng.choice(WORDS),), [("A man, a plan, a canal: Panama",), ("ab",)]),
    family(("title_case", "capitalize_words", "cap_each_word"), _TEXT_ARGS,
           ("returns $a0 with the first letter of every space-separated word upper-cased and the rest lower-cased",
            "capitalises each word of $a0 (first letter upper case, the others lower case)"),
           "def $name($a0):\n    return ' '.join(w[:1].upper() + w[1:].lower() for w in $a0.split(' '))\n",
           "def $name($a0):\n    return $a0.capitalize()\n",
           lambda rng, p: (text(rng, 2, 5),), [("hello wORLD",), ("",)]),
    family(("caesar_shift", "shift_letters", "rotate_letters"), _TEXT_ARGS,
           ("shifts every lowercase letter of $a0 forward by $k places in the alphabet, wrapping from z back to a, and leaves other characters unchanged",
            "applies a Caesar shift of $k to the lowercase letters of $a0 (z wraps to a; everything else stays as is)"),
           "def $name($a0):\n    return ''.join(chr((ord(c) - 97 + $k) % 26 + 97) if 'a' <= c <= 'z' else c for c in $a0)\n",
           "def $name($a0):\n    return ''.join(chr(ord(c) + $k) if c.islower() else c for c in $a0)\n",
           lambda rng, p: (text(rng).lower(),), [("xyz abc",), ("Hello, z!",)],
           params=lambda rng: {"k": rng.randint(1, 25)}),
    family(("unique_chars", "remove_repeated_chars", "first_occurrences"), _TEXT_ARGS,
           ("returns $a0 with every repeated character removed, keeping only the first occurrence of each character in order",
            "drops the second and later occurrences of each character in $a0, preserving the original order"),
           "def $name($a0):\n    seen = set()\n    out = []\n    for ch in $a0:\n        if ch not in seen:\n"
           "            seen.add(ch)\n            out.append(ch)\n    return ''.join(out)\n",
           "def $name($a0):\n    return ''.join(sorted(set($a0)))\n",
           lambda rng, p: (rng.choice(WORDS),), [("banana",), ("zyx zyx",)]),
    family(("longest_word", "find_longest_word", "biggest_word"), _TEXT_ARGS,
           ("returns the longest word in $a0 (words are separated by spaces); on a tie it returns the first one, and for an empty string it returns ''",
            "finds the first longest space-separated word of $a0, or an empty string if there is none"),
           "def $name($a0):\n    best = ''\n    for w in $a0.split():\n        if len(w) > len(best):\n            best = w\n    return best\n",
           "def $name($a0):\n    best = ''\n    for w in $a0.split():\n        if len(w) >= len(best):\n            best = w\n    return best\n",
           lambda rng, p: (text(rng, 2, 6),), [("cat dog emu",), ("",), ("a bb cc",)]),
    family(("run_length_encode", "rle", "compress_runs"), _TEXT_ARGS,
           ('returns the run-length encoding of $a0 as character-count pairs, so "aaab" becomes "a3b1"',
            'compresses runs of equal characters in $a0 into the character followed by the run length ("xxy" gives "x2y1")'),
           "def $name($a0):\n    out = []\n    i = 0\n    while i < len($a0):\n        j = i\n"
           "        while j < len($a0) and $a0[j] == $a0[i]:\n            j += 1\n"
           "        out.append($a0[i] + str(j - i))\n        i = j\n    return ''.join(out)\n",
           "def $name($a0):\n    out = []\n    count = 1\n    for i in range(1, len($a0)):\n"
           "        if $a0[i] == $a0[i - 1]:\n            count += 1\n        else:\n"
           "            out.append($a0[i - 1] + str(count))\n            count = 1\n    return ''.join(out)\n",
           lambda rng, p: (rng.choice(("aa", "b", "ccc", "d")) * rng.randint(1, 3) + rng.choice(WORDS),),
           [("aaabcc",), ("",), ("z",)]),
    family(("count_words", "word_count", "number_of_words"), _TEXT_ARGS,
           ("returns how many words $a0 contains, where words are separated by any amount of whitespace",
            "counts the whitespace-separated words in $a0"),
           "def $name($a0):\n    return len($a0.split())\n",
           "def $name($a0):\n    return $a0.count(' ') + 1\n",
           lambda rng, p: (text(rng, 1, 7),), [("",), ("  two   words ",)]),
    family(("to_snake_case", "camel_to_snake", "snakify"), (("name",), ("identifier",), ("s",)),
           ("converts a camelCase identifier $a0 to snake_case: an underscore before each upper-case letter except the first character, and everything lower-case",
            "turns $a0 from camelCase into snake_case (all lower case, words joined by underscores)"),
           "def $name($a0):\n    out = []\n    for i, ch in enumerate($a0):\n        if ch.isupper() and i > 0:\n"
           "            out.append('_')\n        out.append(ch.lower())\n    return ''.join(out)\n",
           "def $name($a0):\n    out = []\n    for i, ch in enumerate($a0):\n        if ch.isupper() and i > 0:\n"
           "            out.append('_')\n        out.append(ch)\n    return ''.join(out)\n",
           lambda rng, p: (rng.choice(WORDS).lower() + "".join(w.capitalize() for w in text(rng, 1, 3).split()),),
           [("parseHttpResponse",), ("MaxValue",), ("x",)]),
    family(("truncate", "shorten", "clip_text"), _TEXT_ARGS,
           ('returns $a0 unchanged if it has at most $k characters, otherwise its first $k characters followed by "..."',
            'shortens $a0 to $k characters plus "..." when it is longer than $k characters'),
           "def $name($a0):\n    return $a0 if len($a0) <= $k else $a0[:$k] + '...'\n",
           "def $name($a0):\n    return $a0 if len($a0) < $k else $a0[:$k - 1] + '...'\n",
           lambda rng, p: (text(rng, 1, 6),), lambda p: [("x" * p["k"],), ("y" * (p["k"] + 3),)],
           params=lambda rng: {"k": rng.randint(4, 20)}),
    family(("acronym", "make_acronym", "initials"), (("phrase",), ("s",), ("title",)),
           ("returns the upper-case acronym formed by the first letter of each word in $a0 (words may be separated by several spaces)",
            "builds an acronym from $a0: the first letter of every whitespace-separated word, upper-cased"),
           "def $name($a0):\n    return ''.join(w[0].upper() for w in $a0.split())\n",
           "def $name($a0):\n    return ''.join(w[0].upper() for w in $a0.split(' '))\n",
           lambda rng, p: (text(rng, 2, 5),), [("portable network graphics",), ("as  soon as possible",)],
           failure=("exception", "IndexError: string index out of range")),
    family(("parse_pairs", "parse_key_values", "kv_to_dict"), (("s",), ("query",), ("spec",)),
           ('parses a string of key=value pairs separated by "$k" (for example "x=1${k}y=20") into a dict from each key to its integer value; an empty string gives an empty dict',
            'turns $a0, made of key=value items joined by "$k", into a dict whose values are ints'),
           "def $name($a0):\n    result = {}\n    for part in $a0.split('$k'):\n        if part:\n"
           "            key, value = part.split('=')\n            result[key] = int(value)\n    return result\n",
           "def $name($a0):\n    result = {}\n    for part in $a0.split('$k'):\n        if part:\n"
           "            key, value = part.split('=')\n            result[key] = value\n    return result\n",
           lambda rng, p: (p["k"].join(f"{rng.choice(WORDS).lower()}={rng.randint(0, 99)}" for _ in range(rng.randint(1, 3))),),
           lambda p: [("",), (f"a=1{p['k']}b=22",)], params=lambda rng: {"k": rng.choice((";", ",", "&"))}),
    family(("parse_ints", "split_numbers", "csv_to_ints"), (("s",), ("csv",), ("raw",)),
           ('takes a comma-separated string such as "4, 8,15" and returns the list of integers in it, skipping empty entries',
            "splits $a0 on commas and returns the integers as a list, ignoring blank pieces"),
           "def $name($a0):\n    return [int(p) for p in $a0.split(',') if p.strip()]\n",
           "def $name($a0):\n    return [int(p) for p in $a0.split(',')]\n",
           lambda rng, p: (", ".join(str(rng.randint(-50, 99)) for _ in range(rng.randint(1, 5))),),
           [("",), ("1,,2",)], failure=("exception", "ValueError: invalid literal for int() with base 10: ''")),
    family(("extract_numbers", "find_integers", "numbers_in_text"), _TEXT_ARGS,
           ("returns a list of all integers that appear in the text $a0, in order, including negative ones such as -3",
            "finds every integer in $a0 (a leading minus sign belongs to the number) and returns them in order"),
           "import re\n\n\ndef $name($a0):\n    return [int(m) for m in re.findall(r'-?\\d+', $a0)]\n",
           "import re\n\n\ndef $name($a0):\n    return [int(m) for m in re.findall(r'\\d+', $a0)]\n",
           lambda rng, p: (f"{rng.choice(WORDS)} {rng.randint(0, 500)} {rng.choice(WORDS)} {rng.randint(-9, 9)}",),
           [("it was -3 then 12",)]),
    family(("parse_duration", "duration_minutes", "to_minutes"), (("s",), ("duration",), ("span",)),
           ('converts a duration like "2h15m", "45m" or "3h" into a number of minutes',
            'returns the total minutes in a duration string written as hours and/or minutes, e.g. "1h30m" gives 90'),
           "def $name($a0):\n    hours, minutes = 0, 0\n    rest = $a0\n    if 'h' in rest:\n        h, rest = rest.split('h')\n"
           "        hours = int(h)\n    if rest.endswith('m'):\n        minutes = int(rest[:-1])\n    return hours * 60 + minutes\n",
           "def $name($a0):\n    return int($a0.split('h')[-1].rstrip('m') or 0)\n",
           lambda rng, p: (rng.choice((f"{rng.randint(1, 9)}h{rng.randint(1, 59)}m", f"{rng.randint(1, 59)}m", f"{rng.randint(1, 9)}h")),),
           [("2h15m",), ("3h",)]),
    family(("is_valid_ipv4", "valid_ip", "check_ipv4"), (("addr",), ("s",), ("ip",)),
           ("returns True if $a0 is a valid IPv4 address: exactly four decimal numbers from 0 to 255 separated by dots",
            "checks that $a0 has four dot-separated parts, each made of digits and at most 255"),
           "def $name($a0):\n    parts = $a0.split('.')\n    return len(parts) == 4 and all(p.isdigit() and int(p) <= 255 for p in parts)\n",
           "def $name($a0):\n    parts = $a0.split('.')\n    return len(parts) == 4 and all(p.isdigit() for p in parts)\n",
           lambda rng, p: (".".join(str(rng.randint(0, 300)) for _ in range(rng.choice((3, 4, 4, 4)))),),
           [("256.1.1.1",), ("1.2.3",), ("10.0.0.1",)]),
    family(("word_frequencies", "count_each_word", "word_histogram"), _TEXT_ARGS,
           ("returns a dict mapping each lower-cased word of $a0 (split on whitespace) to the number of times it occurs",
            "counts how often each word occurs in $a0, treating upper and lower case as the same word"),
           "def $name($a0):\n    counts = {}\n    for w in $a0.lower().split():\n        counts[w] = counts.get(w, 0) + 1\n    return counts\n",
           "def $name($a0):\n    counts = {}\n    for w in $a0.split():\n        counts[w] = counts.get(w, 0) + 1\n    return counts\n",
           lambda rng, p: (text(rng, 2, 6),), [("The cat the Hat",)]),
)
