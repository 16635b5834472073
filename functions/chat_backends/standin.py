"""The stand-in model: a deterministic answer from the prompt, sent with real token timing.

No weights: the answer repeats the last user message and adds a sentence drawn from a small
vocabulary by a generator seeded with the prompt (and the request's `seed`), so the same request
always gets the same answer. Tokens (a word with its leading space) are released at
`tokens_per_second`, so streaming is visible and testable on any machine.
"""
from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections.abc import AsyncIterator

from runtime.errors import BadRequestError, FunctionServiceError

from .request import OpenAIRequest, message_text
from .shapes import Shaper

__all__ = ("StandinSettings", "generate", "tokenize", "answer_text", "FINGERPRINT")

FINGERPRINT = "fp_fnstream_standin"
_TOKEN = re.compile(r"\s*\S+|\s+")
_VOCABULARY = (
    "stream", "token", "river", "signal", "quiet", "bright", "window", "garden", "letter", "morning",
    "engine", "market", "simple", "careful", "answer", "question", "harbor", "lantern", "circle", "paper",
    "winter", "summer", "little", "golden", "station", "bridge", "silver", "forest", "plain", "steady",
    "moment", "journey", "open", "clear", "north", "ocean", "pattern", "measure", "gentle", "early",
)


class StandinSettings:
    """From the manifest's `environment`: `tokens_per_second` and `filler_words`."""

    def __init__(self, env: dict[str, str]) -> None:
        self.tokens_per_second = _number(env, "tokens_per_second", 40.0)
        self.filler_words = int(_number(env, "filler_words", 16))


def _number(env: dict[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise FunctionServiceError(f"chat function: environment {key!r} must be a number > 0 (got {raw!r})")
    return value


def tokenize(text: str) -> list[str]:
    """Words with their leading whitespace (trailing whitespace is a token): they join to the text."""
    return _TOKEN.findall(text)


def _sentence(prompt: str, seed: int | None, words: int) -> str:
    rng = random.Random(hashlib.sha256(f"{seed}\x00{prompt}".encode()).digest())
    text = " ".join(rng.choice(_VOCABULARY) for _ in range(words))
    return text[:1].upper() + text[1:] + "."


def answer_text(req: OpenAIRequest, filler_words: int) -> tuple[str, str]:
    """(the prompt the answer is drawn from, the whole answer before stop/max_tokens)."""
    if req.chat:
        users = [m for m in req.messages if m.get("role") == "user"] or list(req.messages)
        prompt = " ".join(message_text(users[-1]).split())
        return prompt, f'You said: "{prompt}". {_sentence(prompt, req.seed, filler_words)}'
    prompt = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
    return prompt, " " + _sentence(prompt, req.seed, filler_words)


def _plan(req: OpenAIRequest, filler_words: int) -> tuple[list[str], str]:
    """The tokens to send and the finish reason: cut at the first stop sequence, then at max_tokens."""
    _, text = answer_text(req, filler_words)
    finish = "stop"
    cuts = [i for i in (text.find(s) for s in req.stop) if i >= 0]
    if cuts:
        text = text[:min(cuts)]
    tokens = tokenize(text)
    if req.max_tokens is not None and len(tokens) > req.max_tokens:
        tokens, finish = tokens[:req.max_tokens], "length"
    return tokens, finish


def _prompt_tokens(req: OpenAIRequest) -> int:
    if req.chat:
        return sum(len(tokenize(message_text(m))) for m in req.messages)
    return len(tokenize(req.prompt if isinstance(req.prompt, str) else req.prompt[0]))


def _refuse_unsupported(req: OpenAIRequest) -> None:
    if req.n != 1:
        raise BadRequestError(f"'n' must be 1: the stand-in model gives one choice (got {req.n})")
    if req.body.get("logprobs"):
        raise BadRequestError("'logprobs' is not supported by the stand-in model")
    if isinstance(req.prompt, list) and len(req.prompt) != 1:
        raise BadRequestError("the stand-in model takes one prompt per request")


class _Pacer:
    """Releases token k at start + k / rate, whatever time the consumer took in between."""

    def __init__(self, rate: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()
        self._rate = rate

    async def until(self, k: int) -> None:
        delay = self._start + k / self._rate - self._loop.time()
        if delay > 0:
            await asyncio.sleep(delay)


async def generate(req: OpenAIRequest, settings: StandinSettings) -> AsyncIterator[dict]:
    """Yield the chunks of a streamed answer, or one completion object for `stream: false`."""
    _refuse_unsupported(req)
    tokens, finish = _plan(req, settings.filler_words)
    prompt_tokens = _prompt_tokens(req)
    shaper = Shaper(req.chat, req.model, FINGERPRINT, req.include_usage)
    pacer = _Pacer(settings.tokens_per_second)
    echoed = req.prompt if (req.echo and isinstance(req.prompt, str)) else (req.prompt[0] if req.echo else "")
    if not req.stream:
        await pacer.until(len(tokens))
        yield shaper.completion(echoed + "".join(tokens), finish, prompt_tokens, len(tokens))
        return
    if echoed:
        yield shaper.chunk(echoed)
    if not tokens:
        yield shaper.chunk("", first=True, finish_reason=finish)
    for i, token in enumerate(tokens):
        await pacer.until(i + 1)
        yield shaper.chunk(token, first=i == 0, finish_reason=finish if i == len(tokens) - 1 else None)
    if req.include_usage:
        yield shaper.usage_chunk(prompt_tokens, len(tokens))
