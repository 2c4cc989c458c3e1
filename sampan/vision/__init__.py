"""Vision (layer 8, docs/architecture.md): the OCR synthetic data engine so far (issue 40, part one).

- ``fonts``: the CJK font catalogue, where each font is installed, the fixed held-out fonts;
- ``charset``: the recogniser's character set (corpora + GB2312 level 1 + ASCII + punctuation);
- ``text_sources``: seeded lines and passages from the corpora and generated text;
- ``geometry``: homographies that move images and boxes together;
- ``render``: a line or a page, with exact character / line quadrilaterals;
- ``augment``: seeded degradations (rotation, perspective, low resolution, blur, noise, JPEG);
- ``build``: ``sampan data build-ocr``, the whole data set with its manifest.

Nothing is imported here: ``import sampan.vision`` stays cheap, import the module you need.
"""
