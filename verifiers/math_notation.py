"""Numbers as replies typeset them, rewritten to the plain form the math verifier reads.

math-verify and the hacking rules in verifiers/math.py read numbers as ASCII digits in
LaTeX or plain text. Models also write them as they are typeset elsewhere, and some of
those spellings are misread, not just missed:
  - U+2212 ("−7") is the minus sign; math-verify does not read it as one.
  - A no-break, narrow no-break or thin space between digit groups ("12 000") is SI's
    thousands separator, never a list separator. A plain space stays one: "17 23 391"
    is a list.
  - Scientific notation outside math mode: math-verify reads "1.2 \\times 10^{5}" and
    "1.2e5" as 1.2, which fails the right answer 120000 and passes the wrong one
    (gold 1.2). Each is rewritten to its exact decimal value ("120000").
  - A number with a scale word: "1.5 million" is 1500000; math-verify reads 1.5 (and
    the declared-answer rule read "1 million" as 1, passing a reference of 1).
  - Currency: "\\$28" outside math mode is no answer to math-verify, and "-$1,234.50"
    opens math mode at "$" and loses the sign. "\\$" is always a literal dollar, so it
    goes; "-$1" becomes "$-1", which keeps a math delimiter where it was.

Deliberately not rewritten: "√2" (math-verify reads LaTeX only inside math mode, so a
rewrite alone would not help), number words ("a million", "seven"), and anything whose
value the rewrite would have to guess.
"""
from __future__ import annotations

import re
from decimal import Decimal

_MINUS = str.maketrans({"\u2212": "-"})
_GROUP_SPACE = re.compile(r"(?<=\d)[\u00a0\u202f\u2009](?=\d{3}(?!\d))")
# m × 10^k, in LaTeX or plain text, and m e k. `before` catches an operator that binds
# the mantissa tighter than the product does ("10 / 2 × 10^2" is 500, not 10/200;
# "2^3 × 10^2" is not 2^300): such a match is left as it is. The exponent is at most
# three digits, so a rewrite never builds a huge string.
_SCIENTIFIC = re.compile(
    r"(?P<before>(?:[/÷^_]|\\div)\s*)?(?<![\w.,])(?P<mantissa>\d+(?:\.\d+)?)"
    r"(?:\s*(?:\\times|\\cdot|×|·|\*|x)\s*10\s*\^\s*"
    r"(?:\{\s*(?P<braced>[+-]?\d{1,3})\s*\}|(?P<bare>[+-]?\d{1,3}))"
    r"|[eE](?P<e>[+-]?\d{1,3}))(?![\w^]|\.\d)")
_SCALE = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?\s+(thousand|million|billion|trillion)\b",
                    re.IGNORECASE)
_SCALE_EXPONENT = {"thousand": 3, "million": 6, "billion": 9, "trillion": 12}
_ESCAPED_DOLLAR = re.compile(r"\\\$(?=\s?-?\d)")
# A minus right before a currency dollar, not after a digit or a closing bracket (where
# it would be a binary minus: "$32-$4").
_MINUS_DOLLAR = re.compile(r"(?<![\w)\]}])-\$(?=\d)")


def typeset_to_plain(text: str) -> str:
    """`text` with typeset minus signs, digit-group spaces, scientific notation, scale
    words and currency dollars written as the plain numbers they stand for."""
    text = _GROUP_SPACE.sub("", text.translate(_MINUS))
    text = _SCALE.sub(_expand_scale, _SCIENTIFIC.sub(_expand_scientific, text))
    return _MINUS_DOLLAR.sub("$-", _ESCAPED_DOLLAR.sub("", text))


def _expand_scientific(match: re.Match) -> str:
    if match["before"]:
        return match.group()
    exponent = match["braced"] or match["bare"] or match["e"]
    # Exact: 1.2 × 10^-3 is "0.0012", never the float 0.0012000000000000001.
    return format(Decimal(match["mantissa"]).scaleb(int(exponent)), "f")


def _expand_scale(match: re.Match) -> str:
    number = Decimal(match[1].replace(",", "") + (match[2] or ""))
    return format(number.scaleb(_SCALE_EXPONENT[match[3].lower()]), "f")
