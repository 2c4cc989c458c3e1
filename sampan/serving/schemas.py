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


class OcrRequest(BaseModel):
    """``POST /v1/tasks/ocr`` as JSON: base64 image files (or the file itself as the body, with
    ``Content-Type: image/png``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"inputs": ["iVBORw0KGgo..."]}]})
    inputs: list[StrictStr] = Field(description="base64 image files (PNG, JPEG, BMP, GIF, TIFF, WebP, PPM) or "
                                                "data:image/...;base64, URLs; one result per image, in order")


class OcrLine(BaseModel):
    text: str = Field(description="the line's text")
    score: float = Field(description="recognition confidence, 0-1 (mean per-character probability)")
    box: list[list[float]] = Field(description="the line's four corners [[x, y] x 4] in image pixels, "
                                               "clockwise from the top left")


class OcrResponse(BaseModel):
    task: str
    outputs: list[list[OcrLine]] = Field(description="per image, its lines in reading order ([] for no text)")


class LayoutRegion(BaseModel):
    label: str = Field(description="the region's class (CDLA's: text, title, figure, figure_caption, table, "
                                   "table_caption, header, footer, reference, equation)")
    score: float = Field(description="detection confidence, 0-1")
    box: list[float] = Field(description="x0, y0, x1, y1 in image pixels")


class LayoutResponse(BaseModel):
    task: str
    outputs: list[list[LayoutRegion]] = Field(description="per image, its regions in reading order ([] for none)")


class DocumentPage(BaseModel):
    markdown: str = Field(description="the page as Markdown (headings, paragraphs, tables, figure placeholders)")


class DocumentResponse(BaseModel):
    task: str
    outputs: list[DocumentPage] = Field(description="per image, its Markdown")


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
