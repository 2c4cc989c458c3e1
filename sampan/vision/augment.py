"""Degradations of a rendered image, each seeded and parameterised: rotation and perspective (which
move the boxes with the pixels, through ``geometry.warp``), low resolution, blur, noise and JPEG
artefacts (which leave coordinates alone).

``augment`` draws which ones apply and how strongly from a ``numpy.random.Generator`` and returns
the parameters it used, so every image's label says what was done to it. The order is a camera's:
the page tilts first, then the optics and sensor blur and add noise, then the file is compressed.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
from PIL import Image, ImageFilter

from sampan.utils.config import resolve_nested
from sampan.vision import geometry


@dataclasses.dataclass
class AugmentConfig:
    """How often, and how strongly, each degradation is applied (probabilities in [0, 1]).

    Fields:
        rotate_prob: chance of a rotation.
        max_rotate_deg: a rotation's angle is uniform in [-max, max] degrees.
        perspective_prob: chance of a perspective warp.
        max_perspective: each corner moves up to this fraction of the shorter side.
        lowres_prob: chance of low resolution (down-scaled, then scaled back to the same size).
        lowres_scale: the down-scale factor's range (low, high), each in (0, 1].
        blur_prob: chance of a Gaussian blur.
        max_blur: the blur radius is uniform in [0.3, max] pixels.
        noise_prob: chance of additive Gaussian noise.
        max_noise: the noise's standard deviation is uniform in [2, max] (0-255 scale).
        jpeg_prob: chance of JPEG compression artefacts.
        jpeg_quality: the JPEG quality's range (low, high), each in [5, 95].
    """

    rotate_prob: float = 0.3
    max_rotate_deg: float = 5.0
    perspective_prob: float = 0.2
    max_perspective: float = 0.08
    lowres_prob: float = 0.15
    lowres_scale: tuple[float, float] = (0.4, 0.8)
    blur_prob: float = 0.25
    max_blur: float = 1.2
    noise_prob: float = 0.3
    max_noise: float = 12.0
    jpeg_prob: float = 0.3
    jpeg_quality: tuple[int, int] = (20, 90)

    def __post_init__(self) -> None:
        resolve_nested(self)  # a run file's or the manifest's [low, high] lists become tuples
        for name in ("rotate_prob", "perspective_prob", "lowres_prob", "blur_prob", "noise_prob", "jpeg_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} is a probability in [0, 1], got {getattr(self, name)}")
        if not 0.0 <= self.max_rotate_deg <= 45.0:
            raise ValueError(f"max_rotate_deg must be in [0, 45] degrees, got {self.max_rotate_deg}")
        if not 0.0 <= self.max_perspective <= 0.3:
            raise ValueError(f"max_perspective must be in [0, 0.3] (a fraction of the shorter side), "
                             f"got {self.max_perspective}")
        low, high = self.lowres_scale
        if not 0.0 < low <= high <= 1.0:
            raise ValueError(f"lowres_scale must be (low, high) with 0 < low <= high <= 1, got {self.lowres_scale}")
        if not 0.3 <= self.max_blur <= 10.0:
            raise ValueError(f"max_blur must be in [0.3, 10] pixels, got {self.max_blur}")
        if not 2.0 <= self.max_noise <= 100.0:
            raise ValueError(f"max_noise must be in [2, 100], got {self.max_noise}")
        low, high = self.jpeg_quality
        if not 5 <= low <= high <= 95:
            raise ValueError(f"jpeg_quality must be (low, high) with 5 <= low <= high <= 95, got {self.jpeg_quality}")

    @classmethod
    def none(cls) -> AugmentConfig:
        """No degradation at all (clean renders)."""
        return cls(rotate_prob=0, perspective_prob=0, lowres_prob=0, blur_prob=0, noise_prob=0, jpeg_prob=0)


# -- geometric: the points move with the pixels ------------------------------------------------------
def rotate(image: Image.Image, points: np.ndarray, degrees: float, fill) -> tuple[Image.Image, np.ndarray]:
    """Rotate about the centre, growing the canvas so nothing is cut off."""
    w, h = image.size
    out, moved, _ = geometry.warp(image, geometry.rotation(degrees, (w / 2, h / 2)), points, fill=fill)
    return out, moved


def perspective(image: Image.Image, points: np.ndarray, offsets: np.ndarray, fill) -> tuple[Image.Image, np.ndarray]:
    """Move the image's four corners by ``offsets`` ((4, 2) pixels) and warp the rest to follow."""
    w, h = image.size
    corners = geometry.box_to_quad((0, 0, w, h))
    out, moved, _ = geometry.warp(image, geometry.perspective(corners, corners + offsets), points, fill=fill)
    return out, moved


# -- photometric: coordinates unchanged --------------------------------------------------------------
def low_resolution(image: Image.Image, scale: float) -> Image.Image:
    """Down-scale by ``scale`` and back, as a low-resolution scan or a distant photo looks."""
    w, h = image.size
    small = image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BOX)
    return small.resize((w, h), Image.Resampling.BILINEAR)


def blur(image: Image.Image, radius: float) -> Image.Image:
    return image.filter(ImageFilter.GaussianBlur(radius))


def noise(image: Image.Image, sigma: float, rng: np.random.Generator) -> Image.Image:
    """Additive Gaussian noise of standard deviation ``sigma`` (0-255 scale), the same on each channel
    half the time (sensor luminance noise) and per channel otherwise."""
    a = np.asarray(image, dtype=np.float32)
    shape = a.shape[:2] + (1,) if rng.random() < 0.5 else a.shape
    a = a + rng.normal(0.0, sigma, size=shape).astype(np.float32)
    return Image.fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8), image.mode)


def jpeg(image: Image.Image, quality: int) -> Image.Image:
    """Round-trip through JPEG at ``quality``: blocking and ringing artefacts."""
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=int(quality))
    buffer.seek(0)
    return Image.open(buffer).convert(image.mode)


def augment(image: Image.Image, points: np.ndarray, config: AugmentConfig, rng: np.random.Generator,
            fill) -> tuple[Image.Image, np.ndarray, dict]:
    """Apply the degradations ``config`` draws; returns the image, the moved ``points`` and the
    parameters used (``{"rotate": 2.31, "jpeg": 45, ...}``; empty when none applied)."""
    applied: dict = {}
    # Every probability is drawn whether or not it fires, so one setting's change leaves the others'
    # draws (and so the rest of the data) where they were.
    draws = rng.random(6)
    if draws[0] < config.rotate_prob:
        applied["rotate"] = round(float(rng.uniform(-config.max_rotate_deg, config.max_rotate_deg)), 3)
        image, points = rotate(image, points, applied["rotate"], fill)
    if draws[1] < config.perspective_prob:
        w, h = image.size
        offsets = rng.uniform(-1, 1, size=(4, 2)) * config.max_perspective * min(w, h)
        applied["perspective"] = np.round(offsets, 2).tolist()
        image, points = perspective(image, points, np.array(applied["perspective"]), fill)
    if draws[2] < config.lowres_prob:
        applied["lowres"] = round(float(rng.uniform(*config.lowres_scale)), 3)
        image = low_resolution(image, applied["lowres"])
    if draws[3] < config.blur_prob:
        applied["blur"] = round(float(rng.uniform(0.3, config.max_blur)), 3)
        image = blur(image, applied["blur"])
    if draws[4] < config.noise_prob:
        applied["noise"] = round(float(rng.uniform(2.0, config.max_noise)), 2)
        image = noise(image, applied["noise"], rng)
    if draws[5] < config.jpeg_prob:
        applied["jpeg"] = int(rng.integers(config.jpeg_quality[0], config.jpeg_quality[1] + 1))
        image = jpeg(image, applied["jpeg"])
    return image, points, applied
