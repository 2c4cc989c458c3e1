"""Rendered Chinese document pages with exact layout boxes (``sampan data build-layout``).

Pages are built as HTML from sampan's corpora (``content`` + ``html``), laid out by headless
Chromium (``browser``), and every layout element's box is read back from the DOM; a seeded part of
the pages is degraded like a scan (``scan``), and the set is written as COCO (``coco``, ``build``).
The ten classes are CDLA's, defined once in ``classes``.
"""
