"""A CTC line recogniser in the SVTR-LCNet / CRNN mould: an LCNet backbone that strides the height
down to one row and the width by 4, a small transformer encoder over the columns (a depthwise
convolution gives it positions, so any line length works), a linear head over the charset + blank.

Lines of different widths are batched by padding on the right; ``widths`` tells the model and the
loss how many frames of each line are real.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.nn import functional as F

from sampan.nn import Layer
from sampan.vision import model_io
from sampan.vision.backbone import BackboneConfig, LCNetBackbone
from sampan.vision.charset import charset_text, load_charset
from sampan.vision.ctc_decode import BLANK, CTCCodec, Recognition, greedy_decode

MODEL_TYPE = "sampan_ctc_recognizer"
CHARSET_NAME = "charset.txt"
WIDTH_STRIDE = 4  # the stem and the first stage halve the width; later stages keep it


def _rec_backbone() -> BackboneConfig:
    return BackboneConfig(stage_channels=(32, 64, 128, 256), stage_blocks=(1, 2, 2, 2),
                          stage_strides=((2, 2), (2, 1), (2, 1), (2, 1)))


@dataclasses.dataclass
class RecognizerConfig:
    """A CTC line recogniser.

    Fields:
        num_classes: characters + 1 (the blank, class 0).
        height: line height the images are resized to (32 or 48 in PP-OCR).
        backbone: the LCNet backbone; its stages must stride the width by 2 once in total (the stem
            makes it 4) and the height by any amount.
        hidden: width of the encoder.
        layers: transformer encoder blocks.
        heads: attention heads per block.
        max_width: ``recognize`` caps resized lines at this many pixels (longer ones are squeezed).
    """

    num_classes: int
    height: int = 32
    backbone: BackboneConfig = dataclasses.field(default_factory=_rec_backbone)
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    max_width: int = 1600

    def __post_init__(self):
        if self.num_classes < 2:
            raise ValueError(f"RecognizerConfig.num_classes must be >= 2 (a character and the blank), "
                             f"got {self.num_classes}")
        if self.height < 16:
            raise ValueError(f"RecognizerConfig.height must be >= 16 pixels, got {self.height}")
        width_stride = 2 * int(np.prod([s[1] for s in self.backbone.stage_strides]))
        if width_stride != WIDTH_STRIDE:
            raise ValueError(f"RecognizerConfig.backbone must stride the width by {WIDTH_STRIDE} in all "
                             f"(stem 2 x stages), got {width_stride} from {self.backbone.stage_strides}")
        if self.hidden % self.heads:
            raise ValueError(f"RecognizerConfig.hidden ({self.hidden}) must divide by heads ({self.heads})")
        if self.layers < 0 or self.max_width < WIDTH_STRIDE:
            raise ValueError("RecognizerConfig.layers must be >= 0 and max_width >= 4")

    @classmethod
    def tiny(cls, num_classes: int) -> RecognizerConfig:
        """A small recogniser for tests."""
        return cls(num_classes, backbone=BackboneConfig(stem_channels=8, stage_channels=(16, 24, 32, 32),
                                                        stage_blocks=(1, 1, 1, 1),
                                                        stage_strides=((2, 2), (2, 1), (2, 1), (2, 1))),
                   hidden=32, layers=1, heads=2)


def frame_lengths(widths: torch.Tensor) -> torch.Tensor:
    """Frames (time steps) the model makes from lines ``widths`` pixels wide: ``ceil(w / 4)``."""
    return (widths + WIDTH_STRIDE - 1) // WIDTH_STRIDE


class EncoderBlock(Layer):
    """Conditional position (depthwise conv over time), self-attention, MLP; pre-norm residuals."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.position = nn.Conv1d(dim, dim, 3, padding=1, groups=dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.position(x.transpose(1, 2)).transpose(1, 2)
        n, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(attn.transpose(1, 2).reshape(n, t, d))
        return x + self.mlp(self.norm2(x))


class CTCRecognizer(Layer):
    """``forward(images, widths=None)``: ``(N, 3, height, W)`` normalised lines to CTC logits
    ``(N, ceil(W / 4), num_classes)``. ``widths`` (pixels per line before padding) keeps attention
    off the padding. ``recognize(images)``: RGB line images to :class:`Recognition` results."""

    def __init__(self, config: RecognizerConfig, charset: Sequence[str] | None = None):
        super().__init__()
        self.config = config
        self.codec = CTCCodec(charset) if charset is not None else None
        if self.codec is not None and self.codec.num_classes != config.num_classes:
            raise ValueError(f"the charset gives {self.codec.num_classes} classes (with the blank) but the config "
                             f"says {config.num_classes}")
        self.backbone = LCNetBackbone(config.backbone)
        self.project = nn.Linear(config.backbone.stage_channels[-1], config.hidden)
        self.encoder = nn.ModuleList(EncoderBlock(config.hidden, config.heads) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.hidden)
        self.head = nn.Linear(config.hidden, config.num_classes)

    def forward(self, images: torch.Tensor, widths: torch.Tensor | None = None) -> torch.Tensor:
        model_io.check_images(images, self.config.backbone.in_channels, "CTCRecognizer", min_height=16)
        features = self.backbone(images)[-1].mean(dim=2)  # (N, C, T): the height collapsed
        x = self.project(features.transpose(1, 2))
        mask = None
        if widths is not None:
            valid = torch.arange(x.shape[1], device=x.device)[None, :] < frame_lengths(widths)[:, None]
            x = x * valid[..., None]  # padded frames start at zero (the position conv reads them)
            mask = valid[:, None, None, :]
        for block in self.encoder:
            x = block(x, mask)
        return self.head(self.norm(x))

    def loss(self, logits: torch.Tensor, texts: Sequence[str], widths: torch.Tensor | None = None) -> torch.Tensor:
        """Mean CTC loss of ``logits`` against ``texts`` (needs the charset)."""
        codec = self._codec()
        targets, target_lengths = codec.encode_batch(texts)
        n, t, _ = logits.shape
        input_lengths = frame_lengths(widths) if widths is not None else torch.full((n,), t, dtype=torch.long)
        too_long = [txt for txt, f in zip(texts, input_lengths.tolist(), strict=True) if len(txt) > f]
        if too_long:
            raise ValueError(f"lines with more characters than frames cannot be aligned by CTC: {too_long[:3]} "
                             "(the line images are too narrow for their text)")
        log_probs = F.log_softmax(logits.float(), dim=-1).transpose(0, 1)  # ctc_loss wants (T, N, C)
        return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=BLANK, zero_infinity=True)

    def prepare(self, images: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
        """``(batch, widths)``: RGB line images (PIL or ``(H, W, 3)`` uint8) resized to the model's
        height (aspect kept, width capped at ``max_width``), scaled to [-1, 1], right-padded with 0."""
        if len(images) == 0:
            raise ValueError("prepare got no images")
        h = self.config.height
        arrays = []
        for image in images:
            pil = model_io.to_rgb(image, "recognize")
            w = min(self.config.max_width, max(WIDTH_STRIDE, math.ceil(pil.size[0] * h / pil.size[1])))
            array = np.asarray(pil.resize((w, h), Image.Resampling.BILINEAR), dtype=np.float32)
            arrays.append((array / 255.0 - 0.5) / 0.5)
        widths = torch.tensor([a.shape[1] for a in arrays], dtype=torch.long)
        width = int(frame_lengths(widths.max()).item()) * WIDTH_STRIDE
        batch = torch.zeros(len(arrays), 3, h, width)
        for i, a in enumerate(arrays):
            batch[i, :, :, : a.shape[1]] = torch.from_numpy(a.transpose(2, 0, 1))
        return batch, widths

    @torch.no_grad()
    def recognize(self, images: Sequence) -> list[Recognition]:
        """Read each line image (the model is put in eval mode)."""
        codec = self._codec()
        self.eval()
        batch, widths = self.prepare(images)
        device = next(self.parameters()).device
        probs = self(batch.to(device), widths.to(device)).softmax(-1)
        return greedy_decode(probs, codec.charset, frame_lengths(widths))

    def _codec(self) -> CTCCodec:
        if self.codec is None:
            raise ValueError("this recogniser has no charset: build it with CTCRecognizer(config, charset)")
        return self.codec

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write ``config.json`` + ``model.safetensors`` + ``charset.txt`` into ``directory`` (atomically)."""
        extra = {CHARSET_NAME: charset_text(self.codec.charset)} if self.codec is not None else None
        model_io.save_model(self, self.config, MODEL_TYPE, directory, extra)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> CTCRecognizer:
        """The recogniser :meth:`save_pretrained` wrote (with its charset when one was saved)."""
        config = model_io.load_config(RecognizerConfig, MODEL_TYPE, directory)
        path = Path(directory) / CHARSET_NAME
        model = cls(config, load_charset(path) if path.is_file() else None)
        model_io.load_weights(model, directory)
        return model

