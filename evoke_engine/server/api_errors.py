"""OpenAI-shaped errors: `{"error": {"message", "type", "code", "param"}}` with the right HTTP status.

Invariant: every failure the endpoint reports, validation included, leaves through `ApiError` or one
of the handlers installed by `install_handlers`; the server keeps serving after each.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

if TYPE_CHECKING:
    from .. import Engine, Settings

log = logging.getLogger(__name__)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "invalid_request_error", 409: "conflict_error",
               413: "invalid_request_error", 431: "invalid_request_error",
               500: "server_error", 503: "server_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict:
        return error_body(self.status, self.message, self.code, self.param)


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "code": code, "param": param}}


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status_code=status, headers=headers)


def context_length(engine: Engine) -> int:
    """The tokens one conversation's context holds (a slot's share of n_ctx, unless the slots share one cache)."""
    return context_tokens(engine.settings)


def context_tokens(settings: Settings) -> int:
    """`context_length` from the settings alone (no model loaded): the one context size the endpoint advertises
    (/v1/models, aider's metadata, the overflow error) and enforces (what a request decodes and asks to generate)."""
    return settings.n_ctx // (1 if settings.slot_layout == "unified" else settings.slots)


def reply_room(settings: Settings) -> int:
    """Tokens of a conversation's context that one request's prefill leaves for its reply."""
    return 2 * settings.block_tokens


def aider_metadata(settings: Settings, name: str = "openai/evoke") -> dict:
    """aider's `.aider.model.metadata.json` for this endpoint (litellm's model-info fields): aider learns a model's
    context window only from such a file, never from the server, and warns "Unknown context window size" without."""
    return {name: {"max_tokens": settings.max_tokens, "max_input_tokens": context_tokens(settings),
                   "max_output_tokens": settings.max_tokens, "input_cost_per_token": 0.0,
                   "output_cost_per_token": 0.0, "litellm_provider": "openai", "mode": "chat"}}


def overflow(exc: ApiError, engine: Engine) -> ApiError:
    """A `context_length_exceeded` error worded as OpenAI's, which litellm maps to ContextWindowExceededError."""
    if exc.code != "context_length_exceeded" or "maximum context length is" in exc.message:
        return exc
    return ApiError(400, f"This model's maximum context length is {context_length(engine)} tokens. However, "
                         f"your messages do not fit: {exc.message}", "context_length_exceeded", exc.param or "messages")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None, str]:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return "malformed JSON in the request body", None, "invalid_json"
    parts, param = [], None
    for e in errors[:5]:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        param = param or ".".join(loc) or None
        parts.append(f"{'.'.join(loc) or 'body'}: {e.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request", param, "invalid_request"


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.code, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = _validation_message(exc)
        return error_response(400, message, code, param)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("endpoint request failed")
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "internal_error")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), None, None)
