"""The DB loss's weights (:class:`~sampan.vision.db_loss.DBLoss`), torch-free so that the
``ocr-det-zh`` recipe's settings import no torch."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class DBLossConfig:
    """Weights of the DB loss.

    Fields:
        alpha: weight of the probability map's balanced BCE.
        beta: weight of the threshold map's L1.
        negative_ratio: hard negatives kept per positive pixel (OHEM).
        eps: smoothing of the dice ratio and the averages.
    """

    alpha: float = 5.0
    beta: float = 10.0
    negative_ratio: float = 3.0
    eps: float = 1e-6

    def __post_init__(self):
        if self.alpha < 0 or self.beta < 0 or self.negative_ratio <= 0:
            raise ValueError(f"DBLossConfig needs alpha, beta >= 0 and negative_ratio > 0, got {self}")
