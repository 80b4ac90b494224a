"""The unit registry: base dimensions, named units and SI prefixes.

Every unit is a scale ``factor`` (and, for temperatures, an ``offset``) relative to the
coherent SI unit of its dimension, so that ``value_in_si = value * factor + offset``.
"""

from __future__ import annotations

from dataclasses import dataclass

BASE_DIMENSIONS = ("length", "mass", "time", "current", "temperature", "amount", "luminosity")


class UnitError(ValueError):
    """A unit expression could not be understood."""


class DimensionError(ValueError):
    """Two units measure different things."""


def dims(**exponents: int) -> tuple[int, ...]:
    """A dimension vector, e.g. ``dims(length=1, time=-1)`` for a speed."""
    unknown = set(exponents) - set(BASE_DIMENSIONS)
    if unknown:
        raise ValueError(f"unknown base dimension(s): {', '.join(sorted(unknown))}")
    return tuple(exponents.get(name, 0) for name in BASE_DIMENSIONS)


@dataclass(frozen=True)
class Unit:
    """A unit: ``factor`` SI units of dimension ``dims``, shifted by ``offset``."""

    factor: float
    dims: tuple[int, ...]
    offset: float = 0.0

    @property
    def is_affine(self) -> bool:
        """True for units with an offset (degC, degF): they cannot be combined."""
        return self.offset != 0.0

    def __mul__(self, other: Unit) -> Unit:
        return Unit(self.factor * other.factor,
                    tuple(a + b for a, b in zip(self.dims, other.dims)))

    def __truediv__(self, other: Unit) -> Unit:
        return Unit(self.factor / other.factor,
                    tuple(a - b for a, b in zip(self.dims, other.dims)))

    def __pow__(self, exponent: int) -> Unit:
        return Unit(self.factor ** exponent, tuple(a * exponent for a in self.dims))


DIMENSIONLESS = Unit(1.0, dims())
_L, _M, _T = dims(length=1), dims(mass=1), dims(time=1)
_FORCE = dims(mass=1, length=1, time=-2)
_ENERGY = dims(mass=1, length=2, time=-2)
_POWER = dims(mass=1, length=2, time=-3)

UNITS: dict[str, Unit] = {
    # SI base units (mass is based on the gram so that prefixes work: kg = k + g)
    "m": Unit(1.0, _L),
    "g": Unit(1e-3, _M),
    "s": Unit(1.0, _T),
    "A": Unit(1.0, dims(current=1)),
    "K": Unit(1.0, dims(temperature=1)),
    "mol": Unit(1.0, dims(amount=1)),
    "cd": Unit(1.0, dims(luminosity=1)),
    # derived SI units
    "Hz": Unit(1.0, dims(time=-1)),
    "N": Unit(1.0, _FORCE),
    "Pa": Unit(1.0, dims(mass=1, length=-1, time=-2)),
    "J": Unit(1.0, _ENERGY),
    "W": Unit(1.0, _POWER),
    "C": Unit(1.0, dims(current=1, time=1)),
    "V": Unit(1.0, dims(mass=1, length=2, time=-3, current=-1)),
    "ohm": Unit(1.0, dims(mass=1, length=2, time=-3, current=-2)),
    "Ω": Unit(1.0, dims(mass=1, length=2, time=-3, current=-2)),
    "L": Unit(1e-3, dims(length=3)),
    # time
    "min": Unit(60.0, _T),
    "h": Unit(3600.0, _T),
    "d": Unit(86400.0, _T),
    # imperial
    "in": Unit(0.0254, _L),
    "ft": Unit(0.3048, _L),
    "yd": Unit(0.9144, _L),
    "mi": Unit(1609.344, _L),
    "lb": Unit(0.45359237, _M),
    "oz": Unit(0.028349523125, _M),
    # temperatures with an offset
    "degC": Unit(1.0, dims(temperature=1), offset=273.15),
    "degF": Unit(5 / 9, dims(temperature=1), offset=459.67 * 5 / 9),
}

PREFIXES: dict[str, float] = {
    "Y": 1e24, "Z": 1e21, "E": 1e18, "P": 1e15, "T": 1e12, "G": 1e9, "M": 1e6, "k": 1e3,
    "h": 1e2, "da": 1e1, "d": 1e-1, "c": 1e-2, "m": 1e-3, "u": 1e-6, "n": 1e-9,
    "p": 1e-12, "f": 1e-15,
}


def lookup(symbol: str) -> Unit:
    """The unit for one symbol, with an optional SI prefix (``km``, ``ms``, ``dam``).

    An exact unit name wins over a prefix reading (``min`` is minutes, not milli-inches).
    Temperatures with an offset take no prefix.
    """
    if symbol in UNITS:
        return UNITS[symbol]
    for prefix in sorted(PREFIXES, key=len, reverse=True):
        rest = symbol[len(prefix):]
        if symbol.startswith(prefix) and rest in UNITS:
            unit = UNITS[rest]
            if unit.is_affine:
                raise UnitError(f"{rest!r} does not take a prefix")
            return Unit(unit.factor * PREFIXES[prefix], unit.dims)
    raise UnitError(f"unknown unit {symbol!r}")
