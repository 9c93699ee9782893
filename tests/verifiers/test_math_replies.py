"""The math verifier on replies as real instruct models write them.

Honest replies state their work in many ways and must all pass; hacks (guess lists,
several different answers, echoes of the question) and wrong answers must not. The
question reaches the verifier as the task's prompt, the way the pipeline passes it
(tasks/round/verify.py), not as a spec field.
"""
from __future__ import annotations

import pytest

from verifiers import math as math_verifier
from verifiers.registry import verify

Q_SUM = "What is 47 + 25?"
Q_SUM_WORDS = "Find the sum of 120 and 35."
Q_MUL = "What is 17*23?"
Q_APPLES = "Tom has 12 apples and buys 3 bags of 5 apples each. How many apples does he have now?"
Q_FRAC = "What is 3/4 of 100?"
Q_HALF = "What is 1 divided by 4? Give a fraction."
Q_BIG = "What is 999 + 235?"
Q_NEG = "What is 5 - 12?"
Q_THOUSANDS = "What is 1,000 times 12?"
Q_DEC = "A rope of 10 meters is cut into 4 equal pieces. How long is each piece?"
Q_SCI = "A colony of 300 cells grows 400-fold. How many cells are there?"
Q_RATIO = "What is 6 divided by 5?"
Q_POP = "A town of 500,000 people triples. How many people live there now?"
Q_ONE = "What is 1,000,000 divided by 1,000,000?"
Q_PCT = "20 of the 80 students walk to school. What percent of the students walk?"
Q_DEBT = "Maya had $500 and spent $1,734.50 on credit. What is her balance?"
Q_LEFT = "Maya had $1,734.50 and spent $500. How much does she have left?"
Q_EGGS = "Janet sells 16 eggs a day at $2 each and spends $4 on feed. How much does she make a day?"

HONEST = [
    (Q_SUM, "72", "The sum of 47 and 25 is 72."),
    (Q_SUM, "72", "47 + 25 = 72"),
    (Q_SUM, "72", "47 + 25 = 72."),
    (Q_SUM, "72", "To find the sum, add 47 and 25:\n\n47 + 25 = 72\n\nFinal answer: 72"),
    (Q_SUM, "72", "Step 1: Add the tens: 40 + 20 = 60.\nStep 2: Add the ones: 7 + 5 = 12.\n"
                  "Step 3: 60 + 12 = 72.\nSo the answer is 72."),
    (Q_SUM, "72", "The answer is **72**."),
    (Q_SUM, "72", "Let's add them. 47 plus 25 equals 72."),
    (Q_SUM, "72", "$47 + 25 = \\boxed{72}$"),
    (Q_SUM, "72", "Sure! 47 + 25 = 72. Let me know if you have any other questions."),
    (Q_SUM, "72", "72"),
    (Q_SUM, "72", "Answer: 72"),
    (Q_SUM, "72", "We have 47 + 25. Adding 47 and 25 gives us 72.\n\nTherefore, the sum is 72."),
    (Q_SUM_WORDS, "155", "The sum of 120 and 35 is 155."),
    (Q_SUM_WORDS, "155", "120 + 35 = 155"),
    (Q_SUM_WORDS, "155", "To find the sum of 120 and 35, we add them together: 120 + 35 = 155."),
    (Q_SUM_WORDS, "155", "First, 120 + 30 = 150. Then 150 + 5 = 155. The sum is 155."),
    (Q_MUL, "391", "17 × 23 = 391"),
    (Q_MUL, "391", "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391"),
    (Q_MUL, "391", "To multiply 17 by 23, break it up: 17 * 20 = 340 and 17 * 3 = 51.\n"
                   "Adding them: 340 + 51 = 391.\n\nThe final answer is 391."),
    (Q_MUL, "391", "The product of 17 and 23 is \\(391\\)."),
    (Q_APPLES, "27", "Tom starts with 12 apples. He buys 3 bags with 5 apples each, which is "
                     "3 × 5 = 15 apples. Now he has 12 + 15 = 27 apples."),
    (Q_APPLES, "27", "He has 27 apples now."),
    (Q_APPLES, "27", "3 bags × 5 apples = 15 apples\n12 + 15 = 27\n\nTom has 27 apples."),
    (Q_APPLES, "27", "Final answer: 27 apples"),
    (Q_FRAC, "75", "3/4 of 100 is 75."),
    (Q_FRAC, "75", "To find 3/4 of 100, multiply: (3/4) × 100 = 300/4 = 75.\nThe answer is 75."),
    (Q_HALF, "\\frac{1}{4}", "1 divided by 4 is \\(\\frac{1}{4}\\)."),
    (Q_HALF, "\\frac{1}{4}", "The answer is 1/4."),
    (Q_HALF, "\\frac{1}{4}", "$\\boxed{\\frac{1}{4}}$"),
    (Q_BIG, "1234", "999 + 235 = 1,234"),
    (Q_BIG, "1234", "The sum of 999 and 235 is 1234."),
    (Q_NEG, "-7", "5 - 12 = -7"),
    (Q_NEG, "-7", "Subtracting 12 from 5 gives -7, since 12 is 7 more than 5. The answer is -7."),
    (Q_NEG, "-7", "5 \u2212 12 = \u22127"),  # U+2212, the typeset minus sign
    (Q_NEG, "\u22127", "The answer is -7."),  # a reference typed with it
    (Q_THOUSANDS, "12000", "1,000 \u00d7 12 = 12\u202f000"),  # SI: narrow no-break space between groups
    (Q_THOUSANDS, "12000", "The total is 12\u00a0000."),
    (Q_DEC, "2.5", "Each piece is 10 / 4 = 2.5 meters long."),
    (Q_DEC, "2.5", "Divide the rope: 10 meters ÷ 4 = 2.5 meters.\n\n**Answer:** 2.5 meters"),
    # Reasoning models (Qwen3, R1 distills, SmolLM3): drafts in the thinking are working,
    # only the answer after it is scored (verifiers/reasoning.py).
    (Q_SUM, "72", "<think>\nFirst try: \\boxed{70}? No: 40 + 20 = 60, 7 + 5 = 12, so 72. Maybe 73, 74?\n"
                  "</think>\n\n47 + 25 = 72, so the answer is \\boxed{72}."),
    (Q_SUM, "72", "<think>\nThe answer is 70. No wait, the answer is 72.\n</think>\n\nThe answer is 72."),
    (Q_SUM, "72", "Okay, 47 + 25. Perhaps 70 or 71? 47 + 20 = 67, 67 + 5 = 72.\n</think>\n\n**Answer:** 72"),
    (Q_APPLES, "27", "<think>\n{\"apples\": 12 + 15\n</think>\nTom has 12 + 3 × 5 = 27 apples."),
    # GSM8K and MATH conventions.
    (Q_APPLES, "27", "3 bags have 3 * 5 = 15 apples.\nTom has 12 + 15 = 27 apples.\n#### 27"),
    (Q_BIG, "1234", "999 + 235 = 1,234\n#### 1,234"),
    (Q_HALF, "\\frac{1}{4}", "$\\boxed{\\dfrac{1}{4}}$"),
    (Q_HALF, "\\frac{1}{4}", "The answer is $\\tfrac{1}{4}$."),
    (Q_SUM, "72", "\\boxed{72.0}"),
    (Q_SUM, "72", "Final Answer: The final answer is $72$. I hope it is correct."),
    (Q_APPLES, "27", "| Source | Apples |\n|---|---|\n| Start | 12 |\n| Bags | 15 |\n| **Total** | **27** |"),
    # The same answer stated twice in two forms is one answer.
    (Q_SUM, "72", "The answer is 72.0. Final answer: 72"),
    (Q_HALF, "\\frac{1}{4}", "The answer is 0.25, so the final answer is 1/4."),
    (Q_HALF, "\\frac{1}{4}", "The answer is 0.25, i.e. $\\boxed{\\frac{1}{4}}$"),
    (Q_SUM, "72", "The answer is 47 + 25 = \\boxed{72}"),
    (Q_DEC, "2.5", "The answer is 2 1/2 meters, that is \\boxed{2.5}"),
    # Bold around the answer, then a check: the answer is still the declared one.
    (Q_SUM, "72", "**Answer: 72**\n\nVerification: 72 \u2212 47 = 25"),
    (Q_SUM, "72", "The answer is **72**.\n\nCheck: 72 - 25 = 47."),
    # A check on the declaration's own line: math-verify would read its last `=` (47).
    (Q_SUM, "72", "The answer is 72. Check: 72 - 25 = 47."),
    (Q_SUM, "72", "So the final answer is $72. (Check: 72 - 47 = 25.)"),
    # Scientific notation outside math mode (math-verify alone reads 1.2).
    (Q_SCI, "120000", "300 \u00d7 400 = 1.2 \u00d7 10^5 cells."),
    (Q_SCI, "120000", "The answer is 1.2 \\times 10^{5}."),
    (Q_SCI, "120000", "There are 1.2e5 cells."),
    (Q_POP, "1500000", "500,000 \u00d7 3 = 1.5 million, so 1.5 million people live there now."),
    # Percentages: GSM8K stores "what percent" answers bare; 25% also is 0.25.
    (Q_PCT, "25", "The answer is 25%. Check: 20/80 = 0.25"),
    (Q_PCT, "0.25", "The answer is 25 percent."),
    # Money: a negative amount, a typeset minus, an escaped dollar.
    (Q_DEBT, "-1234.5", "She spent more than she had, so her balance is -$1,234.50."),
    (Q_DEBT, "-1234.5", "Final answer: \u2212$1,234.50"),
    (Q_DEBT, "-1234.5", "**Answer:** -\\$1,234.50"),
    (Q_EGGS, "28", "16 \u00d7 \\$2 = \\$32, and \\$32 - \\$4 = \\$28.\n\nJanet makes \\$28 per day."),
    # Other reasoning formats: <thinking> (Claude-style fine-tunes), <reasoning> (GRPO
    # recipes), gpt-oss's analysis channel, interleaved thinking.
    (Q_SUM, "72", "<thinking>\nThe answer is 70? No: 47 + 25 = 72.\n</thinking>\n\nThe answer is 72."),
    (Q_SUM, "72", "<reasoning>\nFirst guess \\boxed{70}; 47 + 25 = 72.\n</reasoning>\n<answer>\n72\n</answer>"),
    (Q_SUM, "72", "<|channel|>analysis<|message|>47+25. The answer is 70? No, 72.<|end|>"
                  "<|start|>assistant<|channel|>final<|message|>47 + 25 = 72<|return|>"),
    (Q_SUM, "72", "analysisWe need 47+25. Maybe \\boxed{70}.assistantfinalThe answer is 72."),
    (Q_SUM, "72", "<think>\n47 + 25?\n</think>\n\nLet me add the tens first.\n<think>\n40 + 20 = 60, so "
                  "\\boxed{60} so far; 7 + 5 = 12\n</think>\n\n60 + 12 = 72, so the answer is 72."),
]

HACKS = [
    (Q_SUM, "72", "72 73 74 75", "shotgun"),
    (Q_SUM, "72", "The answer is 70, 71, 72 or 73.", "shotgun"),
    (Q_SUM, "72", "It could be 72 or 27.", "shotgun"),
    (Q_SUM, "72", "\\boxed{70} \\boxed{72}", "different"),
    (Q_SUM, "72", "The answer is \\boxed{71, 72, 73}", "shotgun"),
    (Q_SUM, "72", "47 25 72", "echoes"),
    (Q_SUM, "72", "Final answer: 70\nFinal answer: 71\nFinal answer: 72", "different"),
    (Q_SUM, "72", "The answer is 70. The answer is 72.", "different"),
    (Q_MUL, "391", "17 23 391 381", "shotgun"),
    (Q_MUL, "391", "Answer: 381; 391; 401", "shotgun"),
    (Q_SUM_WORDS, "155", "155 maybe 156 maybe 154", "shotgun"),
    (Q_APPLES, "27", "He has 25, 26, 27, 28 or 29 apples.", "shotgun"),
    (Q_SUM, "72", "72\u00a073\u00a074", "shotgun"),  # a no-break space before 1-2 digits joins no group
    (Q_SUM, "72", "The answer is 70.\n\n\\boxed{72}", "different"),  # a declaration and a box
    (Q_SUM, "72", "47 + 25 = 72\n\\boxed{72}\n#### 70", "different"),
    (Q_NEG, "-7", "The answer is -7. Final answer: 7", "different"),
    (Q_SUM, "72", "<think>\nhard to say\n</think>\n\n70, 71, 72 or 73", "shotgun"),
    (Q_SUM, "72", "<think>\n47 + 25 = 72\n</think>\n\\boxed{70} \\boxed{72}", "different"),
    # Guess lists dressed as money, percentages, units, restated variables, asides.
    (Q_SUM, "72", "The answer is $72 or $73.", "shotgun"),
    (Q_PCT, "25", "The answer is 25% or 30%.", "shotgun"),
    (Q_APPLES, "27", "26 apples, 27 apples or 28 apples", "shotgun"),
    (Q_SUM, "72", "x = 72 or x = 73", "shotgun"),
    (Q_SUM, "72", "Answer: 72 (or 73)", "shotgun"),
    (Q_SUM, "72", "It could be 72, or 73.", "shotgun"),
]

WRONG = [
    (Q_SUM, "72", "47 + 25 = 70"),
    (Q_SUM_WORDS, "155", "The sum of 120 and 35 is 375."),
    (Q_MUL, "391", "17 × 23 = 381"),
    (Q_APPLES, "27", "Tom has 12 + 3 + 5 = 20 apples."),
    (Q_DEC, "2.5", "Each piece is 2.4 meters long."),
    (Q_NEG, "-7", "5 \u2212 12 = 7"),
    (Q_THOUSANDS, "12000", "The total is 1\u202f200."),
    # A right draft in the thinking does not make a wrong answer right.
    (Q_SUM, "72", "<think>\n47 + 25 = 72, so \\boxed{72}.\n</think>\n\nFinal answer: 71"),
    (Q_SUM, "72", "<think>\n47 + 25 = 72\n</think>\n\nThe answer is \\boxed{70}."),
    (Q_SUM, "72", "47 + 25 = 72. The answer is 72.\n</think>\n\n#### 70"),
    (Q_SUM, "72", "<think>\n47 + 25 = 72, so the answer is \\boxed{72}. Let me double-check"),  # cut
    (Q_SUM, "72", "<think>\n47 + 25 = 72\n</think>\n"),
    # The declared answer is the answer, even when a line after it computes the right one.
    (Q_SUM, "72", "The answer is 70. Check: 47 + 25 = 72"),
    # Misread notation must not pass a wrong answer: 1.2e5 is not 1.2, -$1,234.50 not 1234.5.
    (Q_RATIO, "1.2", "The answer is 1.2e5."),
    (Q_ONE, "1", "The answer is 1 million."),
    (Q_LEFT, "1234.5", "The answer is -$1,234.50."),
    # A right answer in any reasoning format's thinking does not rescue a wrong one.
    (Q_SUM, "72", "<thinking>\n47 + 25 = \\boxed{72}\n</thinking>\n\n47 + 25 = 70"),
    (Q_SUM, "72", "<reasoning>\nSo \\boxed{72}.\n</reasoning>\n<answer>\n70\n</answer>"),
    (Q_SUM, "72", "analysisWe need 47+25 = 72. So \\boxed{72}.assistantfinal47 + 25 = 70"),
    (Q_SUM, "72", "<think>a</think>Draft.\n<think>\n\\boxed{72}\n</think>\n\n47 + 25 = 70"),
    # Cut while thinking: in gpt-oss's analysis channel, in a later think block.
    (Q_SUM, "72", "<|channel|>analysis<|message|>47 + 25 = \\boxed{72}. Let me double-check"),
    (Q_SUM, "72", "<think>\nstart\n</think>\nAdding.\n<think>\n47 + 25 = \\boxed{72}, let me verify"),
]

# Money, percentages and units in working are not guess lists, nor is one quantity
# stated twice: the bounds of the marked-list rule (these passed before it existed).
MARKED_WORKING = [
    ("She works two days.", "75", "She earned $40 and $35 on the two days, so $75 in total."),
    ("He drives twice.", "150", "He drives 60 miles and 90 miles, 150 miles in total."),
    ("A $50 item is cut to $40. What is the discount in percent?", "20", "The discount is 20%, or $10 off."),
    ("How long is the trip?", "2.5", "It takes 2 hours and 30 minutes, i.e. 2.5 hours."),
]


def test_the_sets_are_large_enough():
    assert len(HONEST) >= 30 and len(HACKS) >= 10


@pytest.mark.parametrize("question, answer, reply", HONEST)
def test_honest_replies_pass_however_they_are_phrased(question, answer, reply):
    verdict = verify("math", {"answer": answer}, reply, prompt=question)
    assert verdict.passed, (verdict.status, verdict.detail)


@pytest.mark.parametrize("question, answer, reply, reason", HACKS)
def test_hacks_are_caught(question, answer, reply, reason):
    verdict = verify("math", {"answer": answer}, reply, prompt=question)
    assert verdict.status == "hacking_suspected" and reason in verdict.detail and verdict.reward == 0.0


@pytest.mark.parametrize("question, answer, reply", WRONG)
def test_wrong_answers_fail(question, answer, reply):
    verdict = verify("math", {"answer": answer}, reply, prompt=question)
    assert not verdict.passed and verdict.reward == 0.0


@pytest.mark.parametrize("question, answer, reply", MARKED_WORKING)
def test_marked_numbers_in_working_are_no_guess_list(question, answer, reply):
    verdict = verify("math", {"answer": answer}, reply, prompt=question)
    assert verdict.status != "hacking_suspected", verdict.detail


def test_without_the_question_a_restated_question_looks_like_guesses():
    """Why the prompt must reach the verifier: without it, 47 and 25 count as guesses."""
    assert math_verifier.verify({"answer": "72"}, "The sum of 47 and 25 is 72.").status == "hacking_suspected"
    assert math_verifier.verify({"answer": "72", "question": Q_SUM}, "The sum of 47 and 25 is 72.").passed
