"""Argument checks shared by optimizers and LR schedules: each error names the argument and its range."""

from __future__ import annotations

from typing import Any


def check_non_negative(name: str, value: Any) -> float:
    """``value`` as a float in [0, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not value >= 0.0:
        raise ValueError(f"{name} must be in [0, inf), got {value}")
    return float(value)


def check_positive(name: str, value: Any) -> float:
    """``value`` as a float in (0, inf)."""
    value = check_non_negative(name, value)
    if value == 0.0:
        raise ValueError(f"{name} must be in (0, inf), got {value}")
    return value


def check_unit_interval(name: str, value: Any) -> float:
    """``value`` as a float in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def check_int(name: str, value: Any, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value
