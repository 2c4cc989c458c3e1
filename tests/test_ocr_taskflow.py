"""``Taskflow("ocr")`` and its image input: every bad input gets its clear error (non-images, truncated
files, empty images, decompression bombs, too-long sides, URLs, odd arrays), every unusual mode is
converted (16-bit, CMYK, palette with transparency, LA / RGBA on white, EXIF orientation, float /
bool / uint16 arrays); then the whole pipeline through the inference predictor on a rendered page
with the tiny memorised models of ``tests/ocr_tiny.py``: the lines come back read, in reading order
(heading, left column, right column), with boxes on the ink and inside the image; a blank image
gives []; a list gives one list per image; `sampan task ocr` prints the same as JSON lines.

Cost on this machine (2 cores shared with three training runs): the 18 tests not marked slow ~3 s
wall; the 6 slow ones (the pipeline, the CLI, the hub module, the served endpoint in process) ~52 s wall when
they run alone, nearly all of it the module's setup: building the tiny pair (~17 s under load) and
exporting both models to ONNX (~33 s under load); the calls themselves take ~3 s. Another test file
in the same session (fuzz, browser) reuses the pair and its export.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from sampan.vision.image_input import ImageInputError, ImageLimits, load_image
from tests.ocr_tiny import png_header


def _png(image: Image.Image, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG", **params)
    return buffer.getvalue()


@pytest.fixture
def page() -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (12, 20, 3), dtype=np.uint8), "RGB")


# -- image input: the same pixels whatever the container -------------------------------------------
def test_paths_bytes_pil_and_arrays_give_the_same_pixels(page, tmp_path):
    path = tmp_path / "page.png"
    path.write_bytes(_png(page))
    want = np.asarray(page)
    before = sorted(tmp_path.iterdir())
    for given in (str(path), path, path.read_bytes(), bytearray(path.read_bytes()), page, want):
        got = load_image(given)
        assert got.dtype == np.uint8 and got.shape == (12, 20, 3)
        np.testing.assert_array_equal(got, want)
    assert sorted(tmp_path.iterdir()) == before  # nothing written beside it


def test_unusual_modes_are_converted():
    grey = np.array([[0, 32896, 65535]], np.uint16)
    sixteen = Image.fromarray(grey)  # mode I;16: scaled to 8 bits, not clipped (a clip would whiten it)
    assert load_image(_png(sixteen))[0, :, 0].tolist() == [0, 128, 255]
    assert load_image(grey)[0, :, 0].tolist() == [0, 128, 255]
    assert load_image(np.array([[0.0, 0.5, 1.0]]))[0, :, 1].tolist() == [0, 128, 255]  # floats in 0-1
    assert load_image(np.array([[True, False]]))[0, :, 2].tolist() == [255, 0]
    assert load_image(np.zeros((2, 3, 1), np.uint8)).shape == (2, 3, 3)
    # RGBA / LA: alpha composited onto white paper
    rgba = np.array([[[200, 0, 0, 255], [200, 0, 0, 0], [0, 0, 0, 128]]], np.uint8)
    want = [[200, 0, 0], [255, 255, 255], [127, 127, 127]]
    assert load_image(rgba)[0].tolist() == want
    assert load_image(_png(Image.fromarray(rgba, "RGBA")))[0].tolist() == want
    assert load_image(_png(Image.fromarray(rgba[:, :, [0, 3]], "LA")))[0, :, 0].tolist() == [200, 255, 127]
    # a palette with a transparent entry
    palette = Image.new("P", (2, 1))
    palette.putpalette([10, 20, 30, 0, 0, 0] + [0] * 762)
    palette.putpixel((1, 0), 1)
    assert load_image(_png(palette, transparency=1))[0].tolist() == [[10, 20, 30], [255, 255, 255]]
    # CMYK (a print-ready JPEG) and 1-bit
    cmyk = io.BytesIO()
    Image.new("CMYK", (4, 4), (0, 255, 255, 0)).save(cmyk, "JPEG", quality=100)
    red = load_image(cmyk.getvalue())[0, 0]
    assert red[0] > 200 and red[1] < 60 and red[2] < 60
    assert load_image(_png(Image.new("1", (3, 2), 1))).min() == 255


def test_exif_orientation_turns_a_phone_photo_upright():
    image = Image.new("RGB", (30, 10), (255, 255, 255))
    image.paste((0, 0, 0), (0, 0, 5, 10))  # a black band on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to view"
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", exif=exif, quality=95)
    upright = load_image(buffer.getvalue())
    assert upright.shape == (30, 10, 3)
    assert upright[:5].mean() < 60 and upright[-5:].mean() > 200  # the band is now on top


@pytest.mark.parametrize("given, reason, says", [
    (b"hello, not an image", "not_image", "not an image sampan can read"),
    (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n", "not_image", "PNG, JPEG"),  # never Ghostscript
    (b"", "empty", "0 bytes"),
    (np.zeros((0, 5, 3), np.uint8), "empty", "0 pixels"),
    (np.zeros((4, 4, 5), np.uint8), "unsupported", "H x W x 3"),
    (np.full((2, 2), np.nan), "unsupported", "NaN"),
    (np.full((2, 2), 300.0), "unsupported", "floats must"),
    (np.full((2, 2), -3, np.int16), "unsupported", "values -3..-3"),
    ("https://example.com/a.png", "not_found", "local files only"),
    ("/no/such/page.png", "not_found", "no such file"),
    ([np.zeros((2, 2), np.uint8)], "unsupported", "a list of images is several images"),
    (3.5, "unsupported", "is a float"),
])
def test_bad_inputs_name_the_problem_and_the_fix(given, reason, says):
    with pytest.raises(ImageInputError, match=says) as err:
        load_image(given)
    assert err.value.reason == reason and isinstance(err.value, ValueError)


def test_truncated_files_bombs_and_huge_sides_are_refused_before_decoding(page, tmp_path):
    whole = _png(Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)))
    with pytest.raises(ImageInputError, match="truncated") as err:
        load_image(whole[: len(whole) // 2])
    assert err.value.reason == "truncated"
    # 100,000 x 100,000 = 10 gigapixels claimed by a 60-byte file: refused from its header
    with pytest.raises(ImageInputError, match="limit|bomb") as err:
        load_image(png_header(100_000, 100_000))
    assert err.value.reason == "too_large"
    with pytest.raises(ImageInputError, match=r"12 x 1 = 12 pixels, more than the limit of 10 \(max_pixels\)"):
        load_image(np.zeros((1, 12), np.uint8), ImageLimits(max_pixels=10))
    with pytest.raises(ImageInputError, match=r"a side longer than the limit of 16 \(max_side\)"):
        load_image(_png(page), ImageLimits(max_side=16))
    with pytest.raises(ImageInputError, match="a PNG of 0 x 7 pixels") as err:
        load_image(png_header(0, 7))
    assert err.value.reason == "empty"
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(ImageInputError, match="empty file"):
        load_image(empty)
    with pytest.raises(ValueError, match="max_pixels must be a positive integer"):
        ImageLimits(max_pixels=0)


def test_line_margin_grows_a_tilted_line_along_its_own_axes():
    import math

    from sampan.taskflow.ocr import grow_quad

    # a 100 x 20 line turned 30 degrees: grown by 0.25 of its height (5 px) on every side
    t = math.radians(30)
    along, down = np.array([math.cos(t), math.sin(t)]), np.array([-math.sin(t), math.cos(t)])
    quad = np.array([[50, 50], [50, 50] + 100 * along, [50, 50] + 100 * along + 20 * down, [50, 50] + 20 * down])
    grown = grow_quad(quad, 0.25)
    np.testing.assert_allclose(grown.mean(0), quad.mean(0), atol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(grown[1] - grown[0]), 110, atol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(grown[3] - grown[0]), 30, atol=1e-9)
    np.testing.assert_allclose(grow_quad(quad, 0.0), quad)


def test_reading_order_takes_columns_one_at_a_time():
    from sampan.taskflow.ocr import reading_order
    from sampan.vision.db_postprocess import TextBox
    from sampan.vision.geometry import box_to_quad

    def box(x0, y0, x1, y1):
        return TextBox(box_to_quad((x0, y0, x1, y1)).astype(np.float32), 0.9)

    heading, l1, l2, r1, r2, foot = (box(20, 0, 180, 10), box(0, 20, 90, 30), box(0, 40, 80, 50),
                                     box(110, 20, 200, 30), box(110, 40, 190, 50), box(0, 60, 200, 70))
    assert reading_order([r2, foot, l2, r1, heading, l1]) == [heading, l1, l2, r1, r2, foot]
    # a label and its value on one row are one row, not two columns
    label, value, next_row = box(0, 0, 40, 10), box(60, 0, 100, 10), box(0, 20, 100, 30)
    assert reading_order([value, next_row, label]) == [label, value, next_row]


# -- the pipeline on tiny memorised models (ONNX exports: slow) -------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.ocr_tiny import build_tiny_ocr

    built = build_tiny_ocr(tmp_path_factory.getbasetemp() / "ocr_tiny")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SAMPAN_HOME", str(built.home))  # the export cache the other OCR tests share
        yield built


@pytest.fixture(scope="module")
def ocr(tiny):
    from sampan.taskflow import Taskflow

    return Taskflow("ocr", batch_size=2, **tiny.options())


@pytest.mark.slow  # exports the tiny detector and recogniser to ONNX once (~20 s on 2 cores)
def test_ocr_reads_a_rendered_page_in_reading_order(ocr, tiny):
    from sampan.inference import Predictor
    from sampan.utils.paths import cache_dir
    from sampan.vision import polygon as P
    from tests.ocr_tiny import LINES, READING_ORDER

    lines = ocr(tiny.page)
    assert [line["text"] for line in lines] == READING_ORDER
    h, w = tiny.page.shape[:2]
    by_text = {text: quad for (text, _, _), quad in zip(LINES, tiny.quads, strict=True)}
    for line in lines:
        assert set(line) == {"text", "score", "box"} and 0.0 < line["score"] <= 1.0
        box = np.array(line["box"])
        assert box.shape == (4, 2) and (box >= 0).all() and (box[:, 0] <= w).all() and (box[:, 1] <= h).all()
        assert P.convex_iou(box, by_text[line["text"]]) > 0.8  # on the line's ink
    json.dumps(lines)  # plain JSON types
    # both models ran through the predictor on exports in the cache
    for stage in (ocr.task.det, ocr.task.rec):
        assert isinstance(stage.predictor, Predictor)
        assert stage.inference_dir.is_relative_to(cache_dir("inference"))


@pytest.mark.slow  # shares the module's export
def test_blank_images_lists_and_containers(ocr, tiny, tmp_path):
    assert ocr(np.full((64, 96, 3), 255, np.uint8)) == []
    assert ocr(Image.new("L", (40, 40), 255)) == []
    single = ocr(tiny.page)
    path = tmp_path / "page.png"
    path.write_bytes(_png(Image.fromarray(tiny.page)))
    rgba = np.concatenate([tiny.page, np.full(tiny.page.shape[:2] + (1,), 255, np.uint8)], axis=2)
    assert ocr([str(path), np.full((32, 32, 3), 255, np.uint8), rgba]) == [single, [], single]
    assert ocr(path.read_bytes()) == single
    with pytest.raises(ImageInputError, match=r"image \[1\] is not an image"):
        ocr([tiny.page, b"not an image"])
    with pytest.raises(ValueError, match="empty list"):
        ocr([])


@pytest.mark.slow  # shares the module's export
def test_sampan_task_ocr_prints_json_lines(ocr, tiny, tmp_path, capsys):
    from sampan.cli import main as cli_main

    path = tmp_path / "page.png"
    path.write_bytes(_png(Image.fromarray(tiny.page)))
    args = ["task", "ocr", str(path), "--batch-size", "2", "--option", f"det_model={tiny.det}",
            "--option", f"rec_model={tiny.rec}"]
    assert cli_main(args) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows == [{"image": str(path), "lines": ocr(tiny.page)}]
    with pytest.raises(SystemExit):
        cli_main(["task", "--help"])
    assert "sampan task ocr page.png" in " ".join(capsys.readouterr().out.split())


@pytest.mark.slow  # shares the module's export
def test_hub_module_recognize_text(ocr, tiny):
    from sampan import hub

    module = hub.Module(name="chinese_ocr_db_crnn", batch_size=2, **tiny.options())
    assert module.recognize_text(images=[tiny.page, np.full((32, 32, 3), 255, np.uint8)]) == [ocr(tiny.page), []]
    assert module.recognize_text(tiny.page) == [ocr(tiny.page)]


def test_unbuilt_models_say_how_to_build_them(tmp_path, monkeypatch):
    from sampan.taskflow import Taskflow

    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path))
    monkeypatch.setattr("sampan.store.models.SHIPPED_DIR", tmp_path / "nothing-shipped")  # a store without them
    with pytest.raises(FileNotFoundError, match="sampan hub build ocr-det-zh"):
        Taskflow("ocr")
    with pytest.raises(ValueError, match="ocr does not take 'det_modle'; for 'det_modle', did you mean 'det_model'"):
        Taskflow("ocr", det_modle="x")
    assert Taskflow.tasks()["ocr"]["models"] == ["ocr-det-zh", "ocr-rec-zh"]


# -- /v1/tasks/ocr in sampan serve (in process, on the module's Taskflow: no second export) ----------
def _serve(ocr, requests: list[tuple[str, dict, bytes]], **limits) -> list:
    """Each ``(path, headers, body)`` POSTed to an app serving ``ocr``; the responses."""
    import asyncio

    import httpx

    from sampan.serving import create_app
    from sampan.serving.config import ServingConfig

    app = create_app(tasks={"ocr": ocr}, limits=ServingConfig(**limits))

    async def go():
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return [await client.post(path, headers=headers, content=body) for path, headers, body in requests]

    return asyncio.run(go())


def _json(images: list[bytes | str]) -> tuple[str, dict, bytes]:
    import base64

    inputs = [i if isinstance(i, str) else base64.b64encode(i).decode() for i in images]
    return "/v1/tasks/ocr", {"content-type": "application/json"}, json.dumps({"inputs": inputs}).encode()


@pytest.mark.slow  # shares the module's export
def test_served_ocr_reads_an_uploaded_page_as_json_or_raw(ocr, tiny):
    import base64

    png = _png(Image.fromarray(tiny.page))
    want = ocr(tiny.page)
    data_url = "data:image/png;base64," + base64.b64encode(png).decode()
    raw = ("/v1/tasks/ocr", {"content-type": "image/png"}, png)
    as_json, as_raw, both = _serve(ocr, [_json([png]), raw, _json([data_url, _png(Image.new("RGB", (40, 30), "white"))])])
    assert as_json.status_code == 200, as_json.text
    assert as_json.json() == {"task": "ocr", "outputs": [want]}
    assert as_raw.json() == {"task": "ocr", "outputs": [want]}
    assert both.json()["outputs"] == [want, []]


@pytest.mark.slow  # shares the module's export
def test_served_ocr_refuses_bad_uploads_with_clear_4xx(ocr, tiny):
    small = _png(Image.fromarray(np.random.default_rng(2).integers(0, 256, (9, 9, 3), dtype=np.uint8)))
    truncated = small[: len(small) // 2]  # within the pixel limit: refused for its missing data
    cases = {  # name -> (request, status, code, words in the message)
        "random bytes": (_json([b"\x00\x01garbage" * 10]), 422, "invalid_image", "not an image"),
        "truncated": (_json([truncated]), 422, "invalid_image", "truncated"),
        "not base64": (_json(["@@@ not base64 @@@"]), 422, "invalid_image", "not valid base64"),
        "zero size": (_json([b""]), 422, "invalid_image", "0 bytes"),
        "bomb": (_json([png_header(60_000, 60_000)]), 413, "image_too_large", "max_image_pixels"),
        "pixels one over": (_json([_png(Image.new("RGB", (11, 10)))]), 413, "image_too_large", "110"),
        "too many": (_json([small] * 3), 413, "too_many_inputs", "max_images_per_request"),
        "empty list": (_json([]), 422, "empty_input", "empty list"),
        "number": (("/v1/tasks/ocr", {"content-type": "application/json"}, b'{"inputs": [3]}'), 422,
                   "invalid_request", "not a base64"),
        "bad json": (("/v1/tasks/ocr", {"content-type": "application/json"}, b'{"inputs": ['), 400, "invalid_json",
                     "not valid JSON"),
        "wrong type": (("/v1/tasks/ocr", {"content-type": "text/plain"}, small), 415, "unsupported_media_type",
                       "image/png"),
        "no type": (("/v1/tasks/ocr", {}, small), 415, "unsupported_media_type", "no Content-Type"),
        "empty raw": (("/v1/tasks/ocr", {"content-type": "image/png"}, b""), 422, "empty_body", "empty"),
        "body one over": (("/v1/tasks/ocr", {"content-type": "image/png"}, b"\0" * 4097), 413, "body_too_large",
                          "max_image_bytes"),
    }
    at_limits = [("/v1/tasks/ocr", {"content-type": "image/png"}, _png(Image.new("RGB", (10, 10), "white"))),
                 _json([_png(Image.new("RGB", (8, 8), "white"))] * 2)]
    responses = _serve(ocr, [c[0] for c in cases.values()] + at_limits,
                       max_image_pixels=100, max_images_per_request=2, max_image_bytes=4096)
    for (name, (_, status, code, says)), response in zip(cases.items(), responses, strict=False):
        assert response.status_code == status, (name, response.text)
        error = response.json()["error"]
        assert error["code"] == code and says in error["message"], (name, error)
    assert [r.status_code for r in responses[-2:]] == [200, 200]  # exactly at the limits
    assert responses[-1].json()["outputs"] == [[], []]
