"""A reasoning model's thinking, cut off so that verifiers score only its answer.

Qwen3, the DeepSeek-R1 distills and SmolLM3 write `<think> ... </think>` before the
answer; when the chat template opens the block itself, the reply holds only `</think>`.
What is inside is working: several candidate numbers, a wrong draft of the program, half
an object. A verifier that read it would reward a right draft followed by a wrong answer
(math-verify prefers any `\\boxed{}`; the code and JSON verifiers fall back on a draft
when the answer has none), and the math hacking rules would count a draft and the answer
as two declared answers. So the registry hands verifiers the text after the thinking, and
the hacking rules see only that: what the model tried while thinking earns nothing, so
it is no hack.

The thinking ends at the first `</think>`; a `<think>` ... `</think>` pair that does not
open the reply is part of the answer (a test string, prose about the tags). A reply that
opens with `<think>` and never closes it was cut at the token budget inside its
thinking: it has no answer (None here, format_error in the registry), however right its
drafts were.

Deliberately not handled: other tag names (`<thinking>`, `<reasoning>`), and replies that
interleave several think blocks with answers (agentic tool use): the answer is everything
after the first `</think>`.
"""
from __future__ import annotations

import re

# A closing tag quoted as text ("'</think>'" in a program that strips think blocks,
# "`</think>`" in prose about them) is content, not the end of the thinking.
_CLOSE = re.compile(r"(?<![`'\"])</think>(?![`'\"])")
_OPEN = re.compile(r"\A\s*<think>")
CUT_DETAIL = "the reply ended inside its <think> block: no answer after the thinking"


def answer_after_thinking(completion: str) -> str | None:
    """The completion without its thinking; None when it was cut inside the thinking."""
    opened, close = _OPEN.match(completion), _CLOSE.search(completion)
    if close is None:
        return None if opened else completion
    if not opened and "<think>" in completion[:close.start()]:
        return completion  # a pair inside the answer ('"<think>x</think>y"'), not thinking
    return completion[close.end():]
