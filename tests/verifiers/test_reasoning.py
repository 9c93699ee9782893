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
    ("<think>plan</think>```python\nx = 1\n```", "```python\nx = 1\n```"),  # a fence, not a quote
    # The other formats real models write, each only when the reply opens with it.
    ("<thinking>\n70?\n</thinking>\n\n72", "\n\n72"),  # Claude-style fine-tunes
    ("<reasoning>\n70?\n</reasoning>\n<answer>72</answer>", "\n<answer>72</answer>"),  # GRPO recipes
    ("[THINK]70?[/THINK]72", "72"),  # Magistral
    ("<|begin_of_thought|>70?<|end_of_thought|>72", "72"),  # Bespoke-Stratos, OpenThinker 1
    ("I wrap drafts in <thinking> tags, then </thinking> ends them.",
     "I wrap drafts in <thinking> tags, then </thinking> ends them."),
    # gpt-oss: the final channel's message, with or without its special tokens.
    ("<|channel|>analysis<|message|>70?<|end|><|start|>assistant<|channel|>final<|message|>72<|return|>", "72"),
    ("analysisWe need 47+25: 70?assistantfinal72", "72"),
    ("Analysis: 47 + 25 = 72.", "Analysis: 47 + 25 = 72."),
    # Interleaved thinking: every block is cut, what lies between them is the answer.
    ("<think>a</think>Part 1.<think>b</think>Part 2.", "Part 1.\nPart 2."),
    ("70? </think>Part 1<think>b</think>72", "Part 1\n72"),
])
def test_the_answer_is_what_follows_the_thinking(reply, answer):
    assert answer_after_thinking(reply) == answer


@pytest.mark.parametrize("reply", [
    "<think>\n47 + 25 = 72, so \\boxed{72}. Let me", "\n<think>", "<think>`</think>`",
    "<thinking>\n\\boxed{72}", " <reasoning>72", "[THINK]72",
    "<think>a</think>Part 1.<think>\\boxed{72}, let me check",  # cut in a later block
    "<|channel|>analysis<|message|>\\boxed{72}. Let me", "analysisWe need \\boxed{72}",
    "<|channel|>analysis<|message|>call a tool<|end|><|start|>assistant<|channel|>commentary<|message|>{}",
])
def test_a_reply_cut_inside_its_thinking_has_no_answer(reply):
    assert answer_after_thinking(reply) is None
