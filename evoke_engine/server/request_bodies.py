"""Request bodies of the endpoint as pydantic models: the fields OpenAI clients send, `evoke_*` extensions.

Invariants: OpenAI fields the engine cannot honour are refused by name (`ChatRequest.refusal`, a 400), other
unknown fields are ignored (clients add their own), wrong types are rejected (400 through the validation
handler; booleans and numbers are strict: `"stream": "true"` or `"max_tokens": "5"` is a 400, never coerced),
`messages` is never empty, an attachment's file name is at most `MAX_FILENAME_CHARS` characters, no string
holds a lone UTF-16 surrogate (`unpaired_surrogate` finds one for a 400 that names where), and a `logit_bias` names
tokens of the vocabulary with finite biases within -100..100 (`check_logit_bias`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from .api_errors import ApiError


class Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionCall(Loose):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(Loose):
    id: str | None = None
    type: str = "function"
    function: FunctionCall


MAX_FILENAME_CHARS = 255      # a file name as file systems allow it: a longer one is a 400, not minutes of prefill


class FilePart(Loose):
    filename: str | None = Field(default=None, max_length=MAX_FILENAME_CHARS)
    file_data: str | None = None         # "data:<mime>;base64,<...>" or plain text


class ContentPart(Loose):
    type: str
    text: str | None = None
    file: FilePart | None = None


class ChatMessage(Loose):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    evoke_keep: Literal["pin", "prefer"] | None = None


class FunctionSpec(Loose):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(Loose):
    type: Literal["function"] = "function"
    function: FunctionSpec


class StreamOptions(Loose):
    include_usage: StrictBool = False


# OpenAI chat fields the engine does not honour: a request that sets one (to anything but its no-op value) gets a
# 400 naming it rather than a reply that silently ignored it.
REFUSED_FIELDS = {"functions": (None,),
                  "function_call": (None, "none", "auto"), "audio": (None,), "modalities": (None, ["text"]),
                  "prediction": (None,), "web_search_options": (None,), "reasoning_effort": (None,),
                  "best_of": (None, 1), "echo": (None, False)}


class SamplingRequest(Loose):
    """The fields chat and raw completions share: the model, streaming and llama.cpp's sampler settings."""
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat | None = Field(default=None, ge=0.0, le=5.0)
    top_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: StrictInt | None = None
    n: StrictInt | None = Field(default=None, ge=1, le=1)
    user: str | None = None
    top_k: StrictInt | None = Field(default=None, ge=0)
    min_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: StrictFloat | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: StrictFloat | None = Field(default=None, ge=-2.0, le=2.0)
    repeat_penalty: StrictFloat | None = Field(default=None, gt=0.0, le=5.0)
    logit_bias: dict[int, float] | None = None
    grammar: str | None = None                 # extension (llama-server's name): GBNF with a `root` rule

    def sampling(self, default_max_tokens: int) -> dict[str, Any]:
        """Keyword arguments for `SamplingParams.from_settings` (through `Conversation.submit` or
        `Engine.complete`)."""
        out: dict[str, Any] = {"max_tokens": self.max_tokens or default_max_tokens}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.top_p is not None:
            out["top_p"] = self.top_p
        if self.seed is not None:
            out["seed"] = self.seed
        if self.stop:
            out["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        for key in ("top_k", "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.logit_bias:
            out["logit_bias"] = [(token, max(-100.0, min(100.0, bias))) for token, bias in self.logit_bias.items()]
        return out

    def extra_refusal(self) -> str | None:
        """The first unknown field set to something the engine would not honour (REFUSED_FIELDS), or None."""
        for key, value in (self.model_extra or {}).items():
            if key in REFUSED_FIELDS and value not in REFUSED_FIELDS[key]:
                return key
        return None


class ChatRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    tools: list[ToolSpec] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    evoke_priority: StrictFloat | None = Field(default=None, ge=0.0, le=100.0)
    evoke_pinned: StrictBool | None = None
    evoke_task_boundary: StrictBool | None = None

    def sampling(self, default_max_tokens: int) -> dict[str, Any]:
        out = super().sampling(default_max_tokens)
        if self.max_completion_tokens:
            out["max_tokens"] = self.max_completion_tokens
        if self.logprobs:
            out["logprobs"] = self.top_logprobs or 0
        return out

    @property
    def asked_max_tokens(self) -> int | None:
        """The reply length the client asked for (`max_completion_tokens`, else `max_tokens`), or None."""
        return self.max_completion_tokens or self.max_tokens

    def refusal(self) -> str | None:
        """The first field this request sets that the engine does not honour (see REFUSED_FIELDS), or None."""
        refused = self.extra_refusal()
        if refused is not None:
            return refused
        if self.logprobs and self.stream:
            return "logprobs (with stream: true)"
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs (without logprobs: true)"
        for message in self.messages:
            if isinstance(message.content, list):
                for part in message.content:
                    if part.type not in ("text", "file"):
                        return f"messages.content.{part.type}"
        return None

    def tool_dicts(self) -> list[dict]:
        return [t.model_dump(exclude_none=True) for t in self.tools or []]

    @property
    def parse_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(SamplingRequest):
    """`POST /v1/completions`: one prompt (text, or token ids) and, for fill-in-the-middle, the text after the gap."""
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    suffix: str | None = None
    logprobs: StrictInt | None = Field(default=None, ge=0, le=5)     # the legacy API: this many alternatives
    echo: StrictBool | None = None
    best_of: StrictInt | None = Field(default=None, ge=1)

    def refusal(self) -> str | None:
        refused = self.extra_refusal()
        if refused is not None:
            return refused
        if self.best_of not in (None, 1):
            return "best_of"
        if self.echo:
            return "echo"
        if self.logprobs is not None and self.stream:
            return "logprobs (with stream: true)"
        if isinstance(self.prompt, list) and len(self.prompt) != 1 and (not self.prompt
                                                                        or not isinstance(self.prompt[0], int)):
            return "prompt (one prompt per request; a list of several is a batch)"
        if self.suffix and not self.single_text():
            return "suffix (with a prompt of token ids)"
        return None

    def single_text(self) -> str | None:
        """The prompt's text when it is text (a string or a list of one), else None (token ids)."""
        if isinstance(self.prompt, str):
            return self.prompt
        return self.prompt[0] if isinstance(self.prompt[0], str) else None

    def token_ids(self) -> list[int]:
        """The prompt as token ids (a list of ints, or a list of one such list)."""
        first = self.prompt[0]
        return list(first) if isinstance(first, list) else list(self.prompt)

    def sampling(self, default_max_tokens: int) -> dict[str, Any]:
        out = super().sampling(default_max_tokens)
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        return out


def unpaired_surrogate(value: Any, path: str = "") -> tuple[str, int] | None:
    """(field path, character index) of the first lone surrogate in a parsed JSON value, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return path or "body", exc.start
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = unpaired_surrogate(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


LOGIT_BIAS_LIMIT = 100.0      # OpenAI's range for a bias: -100..100


def check_logit_bias(bias: dict[int, float] | None, n_vocab: int | None = None) -> None:
    """ApiError 400 for a `logit_bias` entry whose token id is outside the vocabulary (0..n_vocab-1; negative ids
    whatever it is) or whose bias is not a finite number within -100..100 (NaN, 1e308)."""
    for token, value in (bias or {}).items():
        if token < 0 or (n_vocab is not None and token >= n_vocab):
            vocabulary = f"0..{n_vocab - 1}" if n_vocab is not None else "0 and up"
            raise ApiError(400, f"logit_bias: token id {token} is outside the vocabulary ({vocabulary})",
                           "invalid_logit_bias", "logit_bias")
        if not math.isfinite(value) or abs(value) > LOGIT_BIAS_LIMIT:
            raise ApiError(400, f"logit_bias: the bias of token {token} is {value!r}; a bias is a number from "
                                f"-{LOGIT_BIAS_LIMIT:g} to {LOGIT_BIAS_LIMIT:g}", "invalid_logit_bias", "logit_bias")


def check_body(request: ChatRequest | CompletionRequest) -> None:
    """ApiError 400 for a lone surrogate anywhere in the body, a field this server does not honour (named), or a
    `logit_bias` no vocabulary allows (`check_logit_bias`; the ids' upper bound is checked against the model's)."""
    surrogate = unpaired_surrogate(request.model_dump(exclude_none=True))
    if surrogate is not None:
        raise ApiError(400, f"{surrogate[0]}: a lone UTF-16 surrogate at character {surrogate[1]}; "
                            "text must be valid Unicode", "invalid_unicode", surrogate[0])
    refused = request.refusal()
    if refused is not None:
        raise ApiError(400, f"{refused} is not supported by this server; remove it from the request",
                       "unsupported_parameter", refused.split(" ", 1)[0])
    check_logit_bias(request.logit_bias)
