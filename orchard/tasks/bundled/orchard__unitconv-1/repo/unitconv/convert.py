"""Converting values between units."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from unitconv.parse import parse_unit
from unitconv.units import BASE_DIMENSIONS, DimensionError, Unit

UnitLike = Union[str, Unit]


def _unit(unit: UnitLike) -> Unit:
    return parse_unit(unit) if isinstance(unit, str) else unit


def describe(dimensions: tuple[int, ...]) -> str:
    """A readable dimension vector, e.g. ``length time^-1``; ``dimensionless`` for none."""
    parts = []
    for name, exp in zip(BASE_DIMENSIONS, dimensions):
        if exp:
            parts.append(name if exp == 1 else f"{name}^{exp}")
    return " ".join(parts) or "dimensionless"


def convert(value: float, src: UnitLike, dst: UnitLike) -> float:
    """Convert ``value`` from unit ``src`` to unit ``dst``.

    Raises :class:`DimensionError` when the units measure different things.
    """
    s, d = _unit(src), _unit(dst)
    if s.dims != d.dims:
        raise DimensionError(f"cannot convert {src} ({describe(s.dims)}) "
                             f"to {dst} ({describe(d.dims)})")
    si = value * s.factor + s.offset
    return (si - d.offset) / d.factor


@dataclass(frozen=True)
class Quantity:
    """A value with a unit expression, e.g. ``Quantity(3, "km")``."""

    value: float
    unit: str

    def to(self, unit: str) -> Quantity:
        return Quantity(convert(self.value, self.unit, unit), unit)

    def __str__(self) -> str:
        return f"{self.value:g} {self.unit}"
