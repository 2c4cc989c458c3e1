"""Document pages to Markdown (issue 41, part 3): layout regions + OCR lines -> reading order ->
Markdown, and the scores of a page's Markdown against the structure it was rendered from.

Files: ``markdown`` (:func:`page_to_markdown`, :class:`MarkdownConfig`: region clean-up, line
assignment, column detection and reading order, tables from line boxes, rendering), ``scores``
(:func:`document_scores`: character accuracy, headings and table shapes against pages.jsonl's
``structure``). See docs/document.md.
"""

from sampan.vision.document.markdown import MarkdownConfig, page_to_markdown, reading_order
from sampan.vision.document.scores import document_scores, markdown_text, truth_text

__all__ = ["MarkdownConfig", "document_scores", "markdown_text", "page_to_markdown",
           "reading_order", "truth_text"]
