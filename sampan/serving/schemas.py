"""Request and response bodies (pydantic): they drive validation and the OpenAPI schema.

Unknown fields are refused (``extra="forbid"``) so a misspelt key is an error, not silently ignored.
Size limits depend on the running ``ServingConfig`` and are checked by the endpoints.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr


class TaskRequest(BaseModel):
    """``POST /v1/tasks/{task}``: the texts to run, in order."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"inputs": ["今天天气真好"]}]})
    inputs: list[StrictStr] = Field(description="texts, one result per text, in order")


class TaskResponse(BaseModel):
    task: str
    outputs: list[dict[str, Any]] = Field(description="one dict per input text (shape depends on the task)")


class ModelRequest(BaseModel):
    """``POST /v1/models/{name}/predict``: one nested list per model input; dim 0 is the batch."""

    model_config = ConfigDict(extra="forbid",
                              json_schema_extra={"examples": [{"inputs": {"input_ids": [[101, 2345, 102]]}}]})
    inputs: dict[str, list[Any]] = Field(description="input name -> nested list of numbers")


class ModelResponse(BaseModel):
    model: str
    outputs: dict[str, Any] = Field(description="output name -> nested list")


class ErrorDetail(BaseModel):
    code: str = Field(description="machine-readable reason, e.g. invalid_json, unknown_task, text_too_long")
    message: str = Field(description="what was wrong and how to fix it")


class ErrorResponse(BaseModel):
    error: ErrorDetail
