"""The gateway's request and response bodies as its OpenAPI document declares them: OpenAI's
completion and chat requests, its error shape, and the statuses each route may answer."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_TOKENS_LIMIT = 1_000_000


class CompletionBody(BaseModel):
    """An OpenAI completion request; fields steersman does not read pass through to vLLM."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=256)
    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
        | Annotated[list[int], Field(min_length=1)]
        | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    )
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    stream: bool = False
    stream_options: dict[str, bool] | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[dict[str, Any]], Field(min_length=1)]
        | None
    ) = None


class ChatBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=256)
    messages: list[ChatMessage] = Field(
        min_length=1,
        # at least one message carries content (the check in the handler, declared)
        json_schema_extra={
            "contains": {"type": "object", "required": ["content"],
                         "properties": {"content": {"not": {"type": "null"}}}}
        },
    )  # fmt: skip
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    stream: bool = False
    stream_options: dict[str, bool] | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape: every 4xx and 5xx the gateway returns has it."""

    error: ErrorDetail


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    why = {
        400: "Invalid request (the field is named in error.param)",
        401: "Missing or invalid API key",
        403: "This key may not use this endpoint",
        404: "Unknown model or path",
        405: "Method not allowed (see the Allow header)",
        413: "Request body too large",
        422: "Unused: validation errors are answered 400",
        429: "steersman's queue is full",
        500: "Internal error",
        503: "No instance could serve the request",
    }
    return {s: {"model": ErrorResponse, "description": why[s]} for s in statuses}


GENERATION = {
    200: {
        "description": "A completion, or with stream=true its server-sent events",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
    },
    **errors(400, 401, 403, 404, 413, 422, 429, 500, 503),
}


class Health(BaseModel):
    status: str
    instances_up: int
