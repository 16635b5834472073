"""The OpenAI wire objects a backend that generates text itself must produce.

Chat: `chat.completion.chunk` (streamed) and `chat.completion`; completions: `text_completion`
for both. Field sets follow what the openai SDK's types expect.
"""
from __future__ import annotations

import time
import uuid

__all__ = ("Shaper", "usage")


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Shaper:
    """Builds the objects of one response: same `id`, `created`, `model` and fingerprint in each."""

    def __init__(self, chat: bool, model: str, fingerprint: str, include_usage: bool = False) -> None:
        self.chat = chat
        self.model = model
        self.fingerprint = fingerprint
        self.include_usage = include_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}

    def chunk(self, text: str, *, first: bool = False, finish_reason: str | None = None) -> dict:
        """One streamed piece; the first chat delta carries the role."""
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            out = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            out = {**self._head("text_completion"), "choices": [choice]}
        if self.include_usage:
            out["usage"] = None  # every chunk but the last has usage null (OpenAI's convention)
        return out

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        """The extra last chunk of `stream_options.include_usage`: no choices, the totals."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}

    def completion(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
        """The whole answer of a request with `stream: false`."""
        if self.chat:
            message = {"role": "assistant", "content": text, "refusal": None}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}
