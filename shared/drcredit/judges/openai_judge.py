"""Judge backend for any OpenAI-compatible chat-completions server (vLLM, SGLang, OpenAI).

The official ``openai`` client does the HTTP; its own retries are switched off so that
every attempt is recorded and retried by the shared loop in :mod:`drcredit.judges.base`.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Literal

import openai

from drcredit.judges.base import Completion, FatalJudgeError, Judge, Prompt, RetryableError, RetryPolicy

ResponseFormat = Literal["auto", "json_schema", "json_object", "none"]


class OpenAIJudge(Judge):
    backend = "openai"

    def __init__(
        self,
        *,
        base_url: str | None,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_tokens: int = 1024,
        temperature: float = 0.0,
        response_format: ResponseFormat = "auto",
        extra_body: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
    ):
        super().__init__(model, retry)
        # The client's own connection pool (up to 1000 connections) is larger than any
        # judge concurrency we configure, so it is left as it is.
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s, max_retries=0)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.response_format: ResponseFormat = response_format
        self.extra_body = extra_body or {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._client.close()

    def _format_for(self, prompt: Prompt) -> dict[str, Any] | None:
        mode = self.response_format
        if mode in ("auto", "json_schema"):
            return {
                "type": "json_schema",
                "json_schema": {"name": prompt.schema_name, "schema": prompt.schema, "strict": True},
            }
        if mode == "json_object":
            return {"type": "json_object"}
        return None

    def complete(self, prompt: Prompt) -> Completion:
        response_format = self._format_for(prompt)
        try:
            return self._create(prompt, response_format)
        except openai.BadRequestError as exc:
            # A server without structured output support answers 400 to the
            # response_format; in ``auto`` mode fall back to parsing JSON from plain text
            # for this and every later call.
            if response_format is not None and self.response_format == "auto":
                with self._lock:
                    self.response_format = "none"
                try:
                    return self._create(prompt, None)
                except openai.BadRequestError as again:
                    raise FatalJudgeError(f"bad request: {_message(again)}") from again
            raise FatalJudgeError(f"bad request: {_message(exc)}") from exc

    def _create(self, prompt: Prompt, response_format: dict[str, Any] | None) -> Completion:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": prompt.messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if response_format is not None:
            kwargs["response_format"] = response_format
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        try:
            # The client's generic POST (same auth, base URL, timeouts and error types as
            # chat.completions.create) returning the raw body: building the typed response
            # and transforming the request recursively cost more CPU than the rest of a
            # judgment's bookkeeping together, for nothing the judge needs.
            raw = self._client.post("/chat/completions", body=kwargs, cast_to=str)
        except openai.APITimeoutError as exc:
            raise RetryableError("timeout", f"no answer within the timeout: {exc}") from exc
        except openai.APIConnectionError as exc:
            raise RetryableError("connection", f"connection error: {exc}") from exc
        except openai.RateLimitError as exc:
            raise RetryableError("rate_limited", f"429: {_message(exc)}") from exc
        except openai.InternalServerError as exc:
            raise RetryableError("server_error", f"{exc.status_code}: {_message(exc)}") from exc
        except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as exc:
            raise FatalJudgeError(f"{exc.status_code}: {_message(exc)}") from exc
        except openai.BadRequestError:
            raise
        except openai.APIStatusError as exc:
            if exc.status_code >= 500 or exc.status_code in (408, 409, 425):
                raise RetryableError("server_error", f"{exc.status_code}: {_message(exc)}") from exc
            raise FatalJudgeError(f"{exc.status_code}: {_message(exc)}") from exc
        return _completion(raw)


def _completion(raw: str) -> Completion:
    """Read a chat-completions body; anything unreadable is an invalid answer (retried)."""
    try:
        body = json.loads(raw)
        choice = body["choices"][0]
        content = choice["message"].get("content") or ""
        usage = body.get("usage") or {}
        return Completion(
            text=content if isinstance(content, str) else json.dumps(content),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            finish_reason=choice.get("finish_reason"),
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise RetryableError("invalid", f"unreadable chat completion: {raw[:200]!r}") from exc


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and "message" in inner:
            return str(inner["message"])
    return str(exc.message)
