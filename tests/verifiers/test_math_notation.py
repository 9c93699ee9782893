"""`typeset_to_plain`: numbers as replies typeset them, as the math verifier reads them."""
import pytest

from verifiers.math_notation import typeset_to_plain


@pytest.mark.parametrize("text, plain", [
    ("5 \u2212 12 = \u22127", "5 - 12 = -7"),
    ("12\u202f000 and 12\u00a0000", "12000 and 12000"),
    ("72\u00a073", "72\u00a073"),  # a no-break space before two digits joins no group
    # Scientific notation, written out exactly (never a float's 0.0012000000000000001).
    ("The answer is 1.2 \\times 10^{5}.", "The answer is 120000."),
    ("300 \u00d7 400 = 1.2 \u00d7 10^5", "300 \u00d7 400 = 120000"),
    ("1.2e5 and 6.02E+23", "120000 and 602000000000000000000000"),
    ("1.2 x 10^-3", "0.0012"),
    ("\\boxed{3 \\cdot 10^{\u22122}}", "\\boxed{0.03}"),
    # Left alone: an operator binds the mantissa tighter than the product, a longer
    # exponent, names and hex that only look like e-notation.
    ("10 / 2 \u00d7 10^2", "10 / 2 \u00d7 10^2"),
    ("2^3 \\times 10^2", "2^3 \\times 10^2"),
    ("3 \\times 10^{1000}", "3 \\times 10^{1000}"),
    ("x1e5, 0x1e5, 2e5x", "x1e5, 0x1e5, 2e5x"),
    # Scale words, exactly; "thousandths" is no scale.
    ("1.5 million and 2 Billion and 1,500 thousand", "1500000 and 2000000000 and 1500000"),
    ("3 thousandths", "3 thousandths"),
    # Money: an escaped dollar goes, a minus before a dollar moves inside it.
    ("Janet makes \\$28.", "Janet makes 28."),
    ("Her balance is -$1,234.50.", "Her balance is $-1,234.50."),
    ("Her balance is \u2212\\$1,234.50.", "Her balance is -1,234.50."),
    ("$32-$4 = $28", "$32-$4 = $28"),  # a minus between amounts subtracts
])
def test_typeset_numbers_become_plain(text, plain):
    assert typeset_to_plain(text) == plain
