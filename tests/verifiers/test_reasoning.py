"""`answer_after_thinking`: where a reasoning model's thinking ends and its answer starts."""
import pytest

from verifiers.reasoning import answer_after_thinking


@pytest.mark.parametrize("reply, answer", [
    ("<think>\nmaybe 70\n</think>\n\n72", "\n\n72"),
    ("  <think>a</think>b", "b"),
    ("the template opened it: 70?\n</think>\n72", "\n72"),  # Qwen3 / SmolLM3 templates
    ("70? no.</think>72", "72"),
    ("<think>a</think>b</think>c", "b</think>c"),  # the first closing tag ends the thinking
    ("no thinking at all: 72", "no thinking at all: 72"),
    ("Models write <think> before they answer.", "Models write <think> before they answer."),
    # A quoted tag is content: a program or prose about think blocks keeps what precedes it.
    ("return text.split('</think>')[-1]", "return text.split('</think>')[-1]"),
    ('s = "<think>x</think>y"', 's = "<think>x</think>y"'),
    ("Cut everything before `</think>`.", "Cut everything before `</think>`."),
])
def test_the_answer_is_what_follows_the_thinking(reply, answer):
    assert answer_after_thinking(reply) == answer


@pytest.mark.parametrize("reply", ["<think>\n47 + 25 = 72, so \\boxed{72}. Let me", "\n<think>", "<think>`</think>`"])
def test_a_reply_cut_inside_its_thinking_has_no_answer(reply):
    assert answer_after_thinking(reply) is None
