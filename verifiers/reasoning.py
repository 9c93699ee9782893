"""A reasoning model's thinking, cut off so that verifiers score only its answer.

What is inside the thinking is working: several candidate numbers, a wrong draft of the
program, half an object. A verifier that read it would reward a right draft followed by
a wrong answer (math-verify prefers any `\\boxed{}`; the code and JSON verifiers fall
back on a draft when the answer has none), and the math hacking rules would count a
draft and the answer as two declared answers. So the registry hands verifiers the text
outside the thinking, and the hacking rules see only that: what the model tried while
thinking earns nothing, so it is no hack.

The formats real models write:
  - `<think> ... </think>`: Qwen3, QwQ, the DeepSeek-R1 models and distills, SmolLM3,
    Phi-4-reasoning. When the chat template opens the block itself (as DeepSeek-R1's
    and QwQ's do), the reply holds only `</think>`.
  - `<thinking> ... </thinking>`: fine-tunes on Claude-style traces, and models prompted
    to think in tags.
  - `<reasoning> ... </reasoning>`: the format of the TRL / Unsloth GRPO recipes, usually
    followed by `<answer> ... </answer>` (which stays: it is the answer).
  - `[THINK] ... [/THINK]` (Magistral), `<|begin_of_thought|> ... <|end_of_thought|>`
    (Bespoke-Stratos, OpenThinker 1, Sky-T1).
  - gpt-oss's harmony channels: `<|channel|>analysis<|message|>...` then
    `<|channel|>final<|message|>ANSWER`, or as decoded without special tokens,
    "analysisWe need ...assistantfinalANSWER". The answer is the last final message.
Except for `</think>` (opened by a template), thinking counts only when the reply opens
with it (after whitespace); a pair later in a reply that does not open with thinking is
part of the answer (a test string, prose about the tags). A tag quoted as text
("'</think>'" in a program, "`</think>`" in prose) is content.

Several blocks (interleaved thinking: think, write, think again) are all cut; the
answer is what lies outside them, as a chat UI shows it. A reply that ends inside a
block, first or later, was cut at the token budget while thinking, and a harmony reply
with no final message was cut or ended in a tool call: neither has an answer (None
here, format_error in the registry), however right its drafts were.

Deliberately not handled: a stray closing tag after the first block with no opening
before it stays content (the first block already ended the thinking), and tags of one
format do not close another's block.
"""
from __future__ import annotations

import re

CUT_DETAIL = ("the reply ended inside its reasoning (a <think> block or like it): "
              "no answer after the thinking")


def _tag(tag: str) -> re.Pattern:
    # Quoted ('</think>', "`<think>`") is content, not a tag; a code fence right after
    # it ("</think>```python") is the answer starting, not a quote.
    return re.compile(rf"(?<![`'\"]){re.escape(tag)}(?!['\"]|`(?!``))")


# (the reply opens with it, a later opening tag, the closing tag) per format. An opening
# tag that starts the reply is one even before a quote ('<think>"Hmm, ...').
_BLOCKS = [(re.compile(rf"\A\s*{re.escape(open_)}"), _tag(open_), _tag(close)) for open_, close in [
    ("<think>", "</think>"), ("<thinking>", "</thinking>"), ("<reasoning>", "</reasoning>"),
    ("[THINK]", "[/THINK]"), ("<|begin_of_thought|>", "<|end_of_thought|>")]]
_, _THINK_OPEN, _THINK_CLOSE = _BLOCKS[0]
# gpt-oss decoded without its special tokens starts "analysisWe need..."; a reply that
# starts with the word ("Analysis: ...", "analysis of ...") is not one.
_HARMONY_START = re.compile(r"\A\s*(?:<\|start\|>assistant)?<\|channel\|>|\A\s*analysis(?=[A-Z])")
_HARMONY_FINAL = re.compile(r"<\|channel\|>final(?:(?!<\|message\|>).){0,80}<\|message\|>|assistantfinal")
_HARMONY_END = re.compile(r"(?:<\|return\|>|<\|end\|>)\s*\Z")


def answer_after_thinking(completion: str) -> str | None:
    """The completion without its thinking; None when it was cut inside the thinking."""
    if _HARMONY_START.match(completion):
        finals = list(_HARMONY_FINAL.finditer(completion))
        return _HARMONY_END.sub("", completion[finals[-1].end():]) if finals else None
    for opening, open_, close in _BLOCKS:
        start = opening.match(completion)
        if start:
            end = close.search(completion, start.end())
            return None if end is None else _without_blocks(completion[end.end():], open_, close)
    end = _THINK_CLOSE.search(completion)
    if end is None or "<think>" in completion[:end.start()]:
        return completion  # no thinking, or a pair inside the answer ('"<think>x</think>y"')
    return _without_blocks(completion[end.end():], _THINK_OPEN, _THINK_CLOSE)


def _without_blocks(answer: str, open_: re.Pattern, close: re.Pattern) -> str | None:
    """`answer` without later blocks of the same kind (interleaved thinking); None when
    it ends inside one."""
    kept, position = [], 0
    while (start := open_.search(answer, position)) is not None:
        end = close.search(answer, start.end())
        if end is None:
            return None
        kept.append(answer[position:start.start()])
        position = end.end()
    # A line break where each block was: "Part 1<think>..</think>72" is not "Part 172".
    return "\n".join([*kept, answer[position:]])
