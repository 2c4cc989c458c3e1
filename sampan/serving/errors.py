"""One JSON error shape for every 4xx / 5xx: ``{"error": {"code": ..., "message": ...}}``.

The OpenAI-compatible endpoints (``/v1/chat/completions``, ``/v1/completions``, ``GET /v1/models``)
answer in OpenAI's shape instead, ``{"error": {"message", "type", "param", "code"}}``, which its
clients parse; a schema error there is a 400 (OpenAI's status), not a 422.

FastAPI's own answers (422 validation detail lists, 404 / 405 ``{"detail": ...}``) are converted
here so a client parses one shape, and every message says what was wrong and how to fix it.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("sampan.serving")


class ServingError(Exception):
    """An error answered to the client with ``status`` and a machine-readable ``code``."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param  # the request field at fault (OpenAI's error shape carries it)


def is_openai_path(path: str) -> bool:
    """Whether ``path`` is one of the OpenAI-compatible endpoints (answered in OpenAI's error shape)."""
    return (path in ("/v1/chat/completions", "/v1/completions", "/v1/models")
            or (path.startswith("/v1/models/") and "/" not in path[len("/v1/models/"):]))


def openai_error_type(status: int) -> str:
    """OpenAI's ``type`` for a status: its clients map these to exception classes."""
    return {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
            429: "rate_limit_error"}.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_body(code: str, message: str, status: int = 400, param: str | None = None, openai: bool = False) -> dict:
    if openai:
        return {"error": {"message": message, "type": openai_error_type(status), "param": param, "code": code}}
    return {"error": {"code": code, "message": message}}


def error_response(status: int, code: str, message: str, param: str | None = None, openai: bool = False,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(code, message, status, param, openai), status_code=status, headers=headers)


def error_bytes(code: str, message: str, status: int = 400, openai: bool = False) -> bytes:
    """The error body as bytes, for the raw ASGI middleware that answers before FastAPI runs."""
    return json.dumps(error_body(code, message, status, openai=openai), ensure_ascii=False).encode()


# The detail of the 400 FastAPI raises when the body cannot be read as JSON for a reason other than
# a JSONDecodeError (which arrives as a RequestValidationError instead).
_BODY_PARSE_DETAIL = "There was an error parsing the body"

_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "body_too_large",
               415: "unsupported_media_type", 429: "too_many_requests", 503: "unavailable"}


def _is_json_media_type(content_type: str) -> bool:
    """FastAPI's rule for parsing a body as JSON: ``application/json`` or ``application/*+json``."""
    maintype, _, subtype = content_type.split(";")[0].strip().lower().partition("/")
    return maintype == "application" and (subtype == "json" or subtype.endswith("+json"))


def _describe_validation(request: Request, err: RequestValidationError) -> tuple[int, str, str]:
    """(status, code, message) for a pydantic validation failure: 400 / 415 for a body that is not
    JSON, else 422 naming each field at fault."""
    content_type = request.headers.get("content-type", "")
    body_missing = any(item.get("type") == "missing" and tuple(item.get("loc", ())) == ("body",)
                       for item in err.errors())
    # FastAPI parses the body only under a JSON media type; under any other (or none, a non-empty body)
    # the schema error would blame the JSON itself ("Input should be a valid dictionary"): name the cause.
    if not _is_json_media_type(content_type) and (content_type.strip() or not body_missing):
        sent = (f"Content-Type {content_type!r} is not JSON" if content_type.strip()
                else "the request has no Content-Type")
        return 415, "unsupported_media_type", f"{sent}; send the body as JSON with Content-Type: application/json"
    problems = []
    for item in err.errors():
        if item.get("type") == "missing" and tuple(item.get("loc", ())) == ("body",):
            return 422, "empty_body", 'the request body is empty; send e.g. {"inputs": ["今天天气真好"]}'

        if item.get("type") == "json_invalid":
            ctx = item.get("ctx") or {}
            return 400, "invalid_json", (f"the request body is not valid JSON ({ctx.get('error', item.get('msg'))}); "
                                         'send e.g. {"inputs": ["今天天气真好"]} with Content-Type: application/json')
        loc = [str(p) for p in item.get("loc", ()) if p != "body"]
        where = ".".join(loc) if loc else "body"
        problems.append(f"{where}: {item.get('msg', 'invalid')}")
    shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    return 422, "invalid_request", f"the request body does not match the schema: {shown}"


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception to the JSON error shape; an unexpected one is logged and answered 500."""

    @app.exception_handler(ServingError)
    async def _serving(request: Request, exc: ServingError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.param, is_openai_path(request.url.path))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, code, message = _describe_validation(request, exc)
        if not is_openai_path(request.url.path):
            return error_response(status, code, message)
        # OpenAI answers a request that does not fit its schema with 400 and names the field.
        locs = [[str(p) for p in item.get("loc", ()) if p != "body"] for item in exc.errors()]
        param = next((".".join(loc) for loc in locs if loc), None)
        return error_response(400 if status == 422 else status, code, message, param, openai=True)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        if exc.status_code == 404:
            message = (f"no endpoint at {request.url.path}; see GET /v1/tasks for the served tasks and models, "
                       "/openapi.json for the API")
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        elif exc.status_code == 400 and exc.detail == _BODY_PARSE_DETAIL:
            # FastAPI's answer when json.loads fails with something other than JSONDecodeError: bytes
            # that are not UTF-8 / UTF-16 / UTF-32 (UnicodeDecodeError), nesting too deep (RecursionError).
            cause = exc.__cause__
            why = f"{type(cause).__name__}: {cause}" if cause is not None else "it cannot be decoded"
            code, message = "invalid_json", (f"the request body is not valid JSON ({why[:200]}); send UTF-8 JSON, "
                                             'e.g. {"inputs": ["今天天气真好"]} with Content-Type: application/json')
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, code, message, openai=is_openai_path(request.url.path),
                              headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", f"the server failed on this request ({type(exc).__name__}); "
                                                     "it is logged and the service keeps running",
                              openai=is_openai_path(request.url.path))
