"""A streamed chat completion, put back together as the chat.completion it amounts to.

The log of a streamed call must read like the log of the same call unstreamed (ingest's
failure signals read every `choices[i].message`; training reads reasoning and logprobs),
so the chunks are joined per choice: the delta's text fields (content, refusal, a
reasoning parser's reasoning) as text, tool calls by their index with the argument
fragments concatenated, logprobs and token ids as one list, and the last finish_reason,
stop_reason and usage seen. Chunks of `n` > 1 choices are told apart by their index, in
whatever order they come.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Chunk fields that are the chunk's own, not the completion's: the gateway sets id and
# model, and a chunk's `object` names the chunk.
_CHUNK_OWN = ("id", "object", "created", "model", "choices", "usage")


@dataclass
class _Choice:
    message: dict = field(default_factory=lambda: {"role": "assistant", "content": None})
    tool_calls: dict[int, dict] = field(default_factory=dict)
    logprobs: dict | None = None
    rest: dict = field(default_factory=lambda: {"finish_reason": None})
    """The choice's other fields (finish_reason, vLLM's stop_reason and token_ids...)."""


class StreamAssembly:
    """Every field a delta carries is kept, not only the ones OpenAI names: a reasoning
    parser's `reasoning` (`reasoning_content` in older vLLM) is text like `content`, and a
    field this module has never heard of still reaches the log, as the SDK's own
    accumulator keeps it. Text is concatenated, lists (logprobs, token ids) extended,
    anything else is its last non-null value."""

    def __init__(self) -> None:
        self.choices: dict[int, _Choice] = {}
        self.usage: dict | None = None
        self.created: int | None = None
        self.extra: dict = {}
        """Completion-level fields besides the chunk's own (system_fingerprint, vLLM's
        prompt_token_ids on the first chunk...)."""

    def add(self, chunk: dict) -> None:
        self.created = self.created or chunk.get("created")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        _merge_fields(self.extra, {k: v for k, v in chunk.items() if k not in _CHUNK_OWN}, join_lists=False)
        for part in chunk.get("choices") or []:
            if not isinstance(part, dict):
                continue
            choice = self.choices.setdefault(part.get("index", 0), _Choice())
            delta = part.get("delta") if isinstance(part.get("delta"), dict) else {}
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    self._add_tool_call(choice, call)
            choice.message["role"] = delta.get("role") or choice.message["role"]
            _merge_fields(choice.message, {k: v for k, v in delta.items() if k not in ("role", "tool_calls")},
                          join_text=True)
            if isinstance(part.get("logprobs"), dict):
                choice.logprobs = _merge_fields(choice.logprobs or {}, part["logprobs"])
            _merge_fields(choice.rest, {k: v for k, v in part.items() if k not in ("index", "delta", "logprobs")})

    @staticmethod
    def _add_tool_call(choice: _Choice, call: dict) -> None:
        merged = choice.tool_calls.setdefault(call.get("index", len(choice.tool_calls)),
                                              {"id": None, "type": "function",
                                               "function": {"name": "", "arguments": ""}})
        merged["id"] = call.get("id") or merged["id"]
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        merged["function"]["name"] += function.get("name") or ""
        merged["function"]["arguments"] += function.get("arguments") or ""

    def completion(self, completion_id: str, model: str) -> dict:
        choices = []
        for index in sorted(self.choices):
            choice = self.choices[index]
            message = dict(choice.message)
            if choice.tool_calls:
                message["tool_calls"] = [choice.tool_calls[i] for i in sorted(choice.tool_calls)]
            choices.append({"index": index, "message": message, **choice.rest, "logprobs": choice.logprobs})
        return {"id": completion_id, "object": "chat.completion", "created": self.created, "model": model,
                "choices": choices, "usage": self.usage, **self.extra}


def _merge_fields(into: dict, delta: dict, *, join_text: bool = False, join_lists: bool = True) -> dict:
    """`delta`'s fields added to `into`: text appended when `join_text` (a message's
    content, reasoning, refusal; the "" of a role chunk does not turn a null content into
    ""), lists extended when `join_lists` (logprobs, token ids), anything else replaced
    when not null (finish_reason, stop_reason, system_fingerprint)."""
    for key, value in delta.items():
        held = into.get(key)
        if join_text and isinstance(value, str) and isinstance(held, str):
            into[key] = held + value
        elif join_lists and isinstance(value, list) and isinstance(held, list):
            held.extend(value)  # a copy of the first chunk's list (below): a 4k-token reply stays linear
        elif isinstance(value, dict) and isinstance(held, dict):  # e.g. a legacy function_call's fragments
            into[key] = _merge_fields(dict(held), value, join_text=join_text, join_lists=join_lists)
        elif value not in (None, "") or key not in into:
            into[key] = list(value) if isinstance(value, list) else value
    return into


def is_final(chunk: dict) -> bool:
    """A chunk the gateway holds back until the call is logged: one that ends a choice or
    carries only usage. A client that never sees it knows its answer did not complete."""
    choices = chunk.get("choices") or []
    return not choices or any(c.get("finish_reason") for c in choices)
