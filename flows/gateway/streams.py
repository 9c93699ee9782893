"""A streamed chat completion, put back together as the chat.completion it amounts to.

The log of a streamed call must read like the log of any other call (ingest's failure
signals read every `choices[i].message`), so the chunks' deltas are joined per choice:
content and refusal as text, tool calls by their index with the argument fragments
concatenated, and the last finish_reason and usage seen.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Choice:
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict] = field(default_factory=dict)
    finish_reason: str | None = None


class StreamAssembly:
    def __init__(self) -> None:
        self.choices: dict[int, _Choice] = {}
        self.usage: dict | None = None
        self.created: int | None = None

    def add(self, chunk: dict) -> None:
        self.created = self.created or chunk.get("created")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for part in chunk.get("choices") or []:
            choice = self.choices.setdefault(part.get("index", 0), _Choice())
            delta = part.get("delta") or {}
            choice.role = delta.get("role") or choice.role
            if delta.get("content"):
                choice.content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                self._add_tool_call(choice, call)
            choice.finish_reason = part.get("finish_reason") or choice.finish_reason

    @staticmethod
    def _add_tool_call(choice: _Choice, call: dict) -> None:
        merged = choice.tool_calls.setdefault(call.get("index", len(choice.tool_calls)),
                                              {"id": None, "type": "function",
                                               "function": {"name": "", "arguments": ""}})
        merged["id"] = call.get("id") or merged["id"]
        function = call.get("function") or {}
        merged["function"]["name"] += function.get("name") or ""
        merged["function"]["arguments"] += function.get("arguments") or ""

    def completion(self, completion_id: str, model: str) -> dict:
        choices = []
        for index in sorted(self.choices):
            choice = self.choices[index]
            message: dict = {"role": choice.role, "content": "".join(choice.content) if choice.content else None}
            if choice.tool_calls:
                message["tool_calls"] = [choice.tool_calls[i] for i in sorted(choice.tool_calls)]
            choices.append({"index": index, "message": message, "finish_reason": choice.finish_reason})
        return {"id": completion_id, "object": "chat.completion", "created": self.created, "model": model,
                "choices": choices, "usage": self.usage}


def is_final(chunk: dict) -> bool:
    """A chunk the gateway holds back until the call is logged: one that ends a choice or
    carries only usage. A client that never sees it knows its answer did not complete."""
    choices = chunk.get("choices") or []
    return not choices or any(c.get("finish_reason") for c in choices)
