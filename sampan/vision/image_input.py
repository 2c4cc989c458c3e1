"""One image input, whatever the user hands over, as an RGB ``uint8`` array, or an error that says
what was wrong and what to do.

``load_image`` takes a file path, the file's bytes, a PIL image or a numpy array (``H x W``,
``H x W x 1/3/4``; ``uint8``, ``uint16``, ``bool``, other integers within 0..255, floats in 0..1 or
0..255). It

- opens only raster formats Pillow decodes itself and knows by a signature (PNG, JPEG, BMP, GIF,
  TIFF, WebP, PPM / PGM; multi-picture JPEGs): never TGA or ICO (weak signatures: random bytes
  can pass for them), never EPS / PDF-like formats that Pillow would hand to Ghostscript;
- checks the pixel count and each side from the file's header, *before* decoding, against
  :class:`ImageLimits` (sampan's own limit, 50 MP by default, not Pillow's process-wide
  ``MAX_IMAGE_PIXELS``, which other code may change): a decompression bomb is refused without
  being decoded;
- decodes fully, so a truncated file is an error here (never half a page read as white);
- turns the image upright by its EXIF orientation (phone photos);
- converts every mode to RGB: 16-bit and 32-bit grey scaled (not clipped) to 8 bits, CMYK, YCbCr,
  LAB, palette (with its transparency), and alpha (LA / RGBA / PA) composited onto white, as a page
  under a transparent scan reads.

Nothing is written to disk. Every refusal is an :class:`ImageInputError` (a ``ValueError``) with a
``reason`` a server maps to a status (``too_large`` is 413, the others 422).
"""

from __future__ import annotations

import dataclasses
import io
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

# Raster formats Pillow decodes in-process and recognises by a signature. EPS (Ghostscript), PDF-like
# and plugin formats are left out on purpose (an upload must never start another program), and so
# are TGA / ICO, whose loose headers let random bytes open as an image of any size.
FORMATS = ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP", "PPM")  # JPEG opens MPO too
REASONS = ("not_image", "truncated", "empty", "too_large", "unsupported", "not_found")


class ImageInputError(ValueError):
    """A bad image input; ``reason`` is one of :data:`REASONS` (``too_large`` -> HTTP 413, else 422)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class ImageLimits:
    """What an image may be before it is decoded.

    Fields:
        max_pixels: most pixels (width x height) accepted: 50 MP by default, a 7,000 x 7,000 scan.
            Larger ones are refused from the header, before decoding (a decompression bomb never
            allocates its pixels).
        max_side: longest side accepted, in pixels (a 1 x 40,000,000 strip is no page either).
    """

    max_pixels: int = 50_000_000
    max_side: int = 30_000

    def __post_init__(self):
        for name in ("max_pixels", "max_side"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ImageLimits.{name} must be a positive integer, got {value!r}")

    def check(self, width: int, height: int, who: str) -> None:
        """An ``ImageInputError`` for an empty image or one over the limits."""
        if width <= 0 or height <= 0:
            raise ImageInputError("empty", f"{who} is empty ({width} x {height} pixels): send an image with "
                                           "at least one pixel")
        if width * height > self.max_pixels:
            raise ImageInputError("too_large", f"{who} has {width} x {height} = {width * height:,} pixels, more "
                                               f"than the limit of {self.max_pixels:,} (max_pixels): scale it "
                                               "down (text stays readable at 2,000-3,000 pixels a side) or raise "
                                               "the limit")
        if max(width, height) > self.max_side:
            raise ImageInputError("too_large", f"{who} is {width} x {height} pixels, a side longer than the "
                                               f"limit of {self.max_side:,} (max_side): cut it into pages or "
                                               "scale it down")


def load_image(image: object, limits: ImageLimits | None = None, who: str = "the image") -> np.ndarray:
    """``image`` (a path, bytes, a PIL image or a numpy array) as an ``(H, W, 3)`` ``uint8`` RGB array.

    Raises :class:`ImageInputError` naming the problem and the fix (module docstring).
    """
    limits = limits or ImageLimits()
    if isinstance(image, np.ndarray):
        return _from_array(image, limits, who)
    if isinstance(image, Image.Image):
        limits.check(image.size[0], image.size[1], who)
        return _to_rgb_array(_upright(image), who)
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        if not data:
            raise ImageInputError("empty", f"{who} is 0 bytes: send the image file's contents")
        return _decode(io.BytesIO(data), limits, who)
    if isinstance(image, (str, os.PathLike)):
        path = Path(image).expanduser()
        if isinstance(image, str) and image.startswith(("http://", "https://")):
            raise ImageInputError("not_found", f"{who} is a URL ({image[:80]}); sampan reads local files only: "
                                               "download it first and pass the file's path")
        if not path.is_file():
            raise ImageInputError("not_found", f"{who}: no such file {str(path)[:200]!r}; pass the path of an "
                                               "image file, its bytes, a PIL image or a numpy array")
        if path.stat().st_size == 0:
            raise ImageInputError("empty", f"{who} ({path}) is an empty file (0 bytes)")
        with open(path, "rb") as f:
            return _decode(f, limits, f"{who} ({path.name})")
    kind = type(image).__name__
    hint = " (a list of images is several images: pass each one as a numpy array)" if isinstance(image, list) else ""
    raise ImageInputError("unsupported", f"{who} is a {kind}: pass a file path, the file's bytes, a PIL image or "
                                         f"a numpy array (H x W or H x W x 3 / 4){hint}")


def _decode(stream, limits: ImageLimits, who: str) -> np.ndarray:
    try:
        # Pillow's own bomb check (its MAX_IMAGE_PIXELS) may fire while the header is read; ours
        # below runs on every image, whatever that global is set to.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(stream, formats=FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageInputError("too_large", f"{who} is a decompression bomb or far too large ({err}); "
                                           f"sampan's limit is {limits.max_pixels:,} pixels (max_pixels)") from None
    except UnidentifiedImageError:
        _refuse_empty_png(stream, who)
        raise ImageInputError("not_image", f"{who} is not an image sampan can read: send a PNG, JPEG, BMP, GIF, "
                                           "TIFF, WebP or PPM file") from None
    except (OSError, SyntaxError, ValueError) as err:  # a header Pillow recognised but cannot parse
        raise ImageInputError("not_image", f"{who} has a broken image header ({type(err).__name__}: "
                                           f"{str(err)[:120]}); send the file again or re-save it") from None
    with opened:
        limits.check(opened.size[0], opened.size[1], who)
        try:
            opened.load()  # the whole file decoded now: a truncated one fails here
        except (OSError, SyntaxError, ValueError, EOFError) as err:
            raise ImageInputError("truncated", f"{who} is truncated or corrupt ({str(err)[:120]}); the "
                                               "pixels cannot all be read: send the whole file") from None
        except Image.DecompressionBombError as err:
            raise ImageInputError("too_large", f"{who} decompresses to too much data ({err})") from None
        return _to_rgb_array(_upright(opened), who)


def _refuse_empty_png(stream, who: str) -> None:
    """Pillow cannot tell a PNG whose header says 0 pixels from garbage; say which it is."""
    stream.seek(0)
    head = stream.read(24)
    if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
        width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
        if width == 0 or height == 0:
            raise ImageInputError("empty", f"{who} is a PNG of {width} x {height} pixels: an empty image "
                                           "has nothing to read; send one with at least one pixel") from None


def _upright(image: Image.Image) -> Image.Image:
    """The image turned by its EXIF orientation tag (a phone photo held sideways), if it has one."""
    try:
        return ImageOps.exif_transpose(image) or image
    except (OSError, ValueError, SyntaxError, KeyError):
        return image  # an unreadable EXIF block is no reason to refuse the pixels


def _to_rgb_array(image: Image.Image, who: str) -> np.ndarray:
    mode = image.mode
    if mode == "RGB":
        return np.asarray(image, dtype=np.uint8).copy()
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        return _from_array(np.asarray(image), ImageLimits(max_pixels=2**62, max_side=2**31), who,
                           sixteen_bit=mode.startswith("I;16") or (mode == "I" and _fits_16(image)))
    if mode == "P":
        # a palette's transparency (tRNS or GIF's transparent index) becomes alpha, then white
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    elif mode in ("PA", "La"):
        image = image.convert("RGBA")
    if image.mode in ("LA", "RGBA", "RGBa"):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return np.asarray(Image.alpha_composite(white, rgba).convert("RGB"), dtype=np.uint8).copy()
    try:
        return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()  # L, 1, CMYK, YCbCr, LAB, HSV
    except (ValueError, OSError) as err:
        raise ImageInputError("unsupported", f"{who} has pixel mode {mode!r}, which sampan cannot convert to "
                                             f"RGB ({err}); save it as an 8-bit RGB PNG") from None


def _fits_16(image: Image.Image) -> bool:
    """Pillow opens 16-bit PNGs as mode "I" on some versions: values above 255 mean 16 bits."""
    extrema = image.getextrema()
    return isinstance(extrema, tuple) and extrema[1] > 255


def _from_array(array: np.ndarray, limits: ImageLimits, who: str, sixteen_bit: bool = False) -> np.ndarray:
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (2, 3, 4)):
        raise ImageInputError("unsupported", f"{who} is an array of shape {array.shape}: pass H x W (grey), "
                                             "H x W x 3 (RGB) or H x W x 4 (RGBA), channels last")
    limits.check(array.shape[1], array.shape[0], who)
    pixels = _to_uint8(array, who, sixteen_bit)
    if pixels.ndim == 2:
        return np.repeat(pixels[:, :, None], 3, axis=2)
    if pixels.shape[2] == 3:
        return np.ascontiguousarray(pixels)
    colour = pixels[:, :, :-1] if pixels.shape[2] == 4 else np.repeat(pixels[:, :, :1], 3, axis=2)
    alpha = pixels[:, :, -1:].astype(np.float32) / 255.0  # alpha composited onto white paper
    return np.round(colour * alpha + 255.0 * (1.0 - alpha)).astype(np.uint8)


def _to_uint8(array: np.ndarray, who: str, sixteen_bit: bool = False) -> np.ndarray:
    if array.dtype == np.uint8:
        return array
    if array.dtype == np.bool_:
        return array.astype(np.uint8) * 255
    if array.dtype == np.uint16 or sixteen_bit:
        # 65535 -> 255: scaled, not clipped (a clip turns a 16-bit scan white)
        return np.round(np.clip(array.astype(np.float64), 0, 65535) / 257.0).astype(np.uint8)
    if np.issubdtype(array.dtype, np.integer):
        low, high = int(array.min()), int(array.max())
        if low < 0 or high > 255:
            raise ImageInputError("unsupported", f"{who} is {array.dtype} with values {low}..{high}: pass uint8 "
                                                 "(0-255), uint16 (0-65535) or floats in 0-1")
        return array.astype(np.uint8)
    if np.issubdtype(array.dtype, np.floating):
        if not np.isfinite(array).all():
            raise ImageInputError("unsupported", f"{who} holds NaN or infinite values: pass finite pixels")
        low, high = float(array.min()), float(array.max())
        if low >= 0.0 and high <= 1.0:
            return np.round(array * 255.0).astype(np.uint8)
        if low >= 0.0 and high <= 255.0:
            return np.round(array).astype(np.uint8)
        raise ImageInputError("unsupported", f"{who} is {array.dtype} with values {low:g}..{high:g}: floats must "
                                             "lie in 0-1 (or 0-255)")
    raise ImageInputError("unsupported", f"{who} has dtype {array.dtype}: pass uint8, uint16 or float pixels")
