"""The context window: how many tokens a prompt takes, and the room left for the answer.

A server reports its window (vLLM's ``max_model_len`` in ``/v1/models``, llama.cpp's
per-slot ``n_ctx`` in ``/props``) or the operator sets it; the prompt's size in tokens is
known exactly only from the server's own count (its ``usage``, or the numbers a context
overflow error carries). Before a call it is estimated from the prompt's characters,
with the range of characters per token this endpoint has shown so far: the estimate
that decides a prompt *cannot* fit is the smallest plausible token count, and the one
that bounds ``max_tokens`` the largest, so neither a prompt that fits is refused nor an
answer given room the context does not have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: Characters per token assumed before the endpoint has answered: a range wide enough
#: for English prose and for JSON-heavy prompts under common tokenizers.
ASSUMED_CHARS_PER_TOKEN = (2.0, 5.0)
#: Fewest answer tokens worth asking for: a prompt leaving less is refused at once.
MIN_ANSWER_TOKENS = 16

_VLLM = re.compile(r"maximum context length is (\d+) tokens.*?(?:requested|has|resulted in) (\d+)", re.S)
_VLLM_PARTS = re.compile(r"\((\d+) in the messages, (\d+) in the completion\)")


@dataclass(frozen=True)
class Overflow:
    """What a context-overflow error says: the window, and the prompt's tokens when given."""

    context_tokens: int
    prompt_tokens: int | None


class TokenRatio:
    """Characters per prompt token seen on one endpoint (its tokenizer, our prompts)."""

    def __init__(self) -> None:
        self.low: float | None = None
        self.high: float | None = None

    def observe(self, chars: int, tokens: int) -> None:
        if tokens <= 0 or chars <= 0:
            return
        ratio = chars / tokens
        self.low = ratio if self.low is None else min(self.low, ratio)
        self.high = ratio if self.high is None else max(self.high, ratio)

    def fewest(self, chars: int) -> int:
        """The smallest plausible token count of ``chars`` characters."""
        high = self.high * 1.1 if self.high is not None else ASSUMED_CHARS_PER_TOKEN[1]
        return int(chars / high)

    def most(self, chars: int) -> int:
        """The largest plausible token count of ``chars`` characters."""
        low = self.low * 0.9 if self.low is not None else ASSUMED_CHARS_PER_TOKEN[0]
        return int(chars / low) + 1


def overflow_of(body: Any, message: str) -> Overflow | None:
    """The numbers of a context-overflow error (llama.cpp's ``exceed_context_size_error``,
    vLLM's and OpenAI's "maximum context length" message), or None for another error."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("n_ctx"), int):
        prompt = error.get("n_prompt_tokens")
        return Overflow(error["n_ctx"], prompt if isinstance(prompt, int) else None)
    match = _VLLM.search(message)
    if match is None:
        return None
    parts = _VLLM_PARTS.search(message)
    prompt = int(parts.group(1)) if parts else int(match.group(2))
    return Overflow(int(match.group(1)), prompt)


def served_context(models: Any, props: Any) -> tuple[int | None, int | None]:
    """(context tokens per request, parallel slots) from ``/v1/models`` and ``/props``.

    llama.cpp divides ``-c`` among its ``--parallel`` slots and reports one slot's share
    as ``default_generation_settings.n_ctx``; vLLM reports ``max_model_len`` per model.
    """
    context: int | None = None
    slots: int | None = None
    if isinstance(props, dict):
        settings = props.get("default_generation_settings")
        if isinstance(settings, dict) and isinstance(settings.get("n_ctx"), int):
            context = settings["n_ctx"]
        if isinstance(props.get("total_slots"), int) and props["total_slots"] > 0:
            slots = props["total_slots"]
    if context is None and isinstance(models, dict):
        for model in models.get("data") or []:
            if isinstance(model, dict) and isinstance(model.get("max_model_len"), int):
                context = model["max_model_len"]
                break
    return context, slots


def too_long(needed: int, context: int, url: str, *, estimated: bool) -> str:
    about = "about " if estimated else ""
    return (
        f"the prompt needs {about}{needed} tokens and the context of {url} holds {context}"
        f" (with at least {MIN_ANSWER_TOKENS} for the answer): give the judge a larger context per request"
        " (llama.cpp: -c divided by --parallel; vLLM: --max-model-len) or shorter page evidence"
    )
