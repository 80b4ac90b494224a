"""Parsing of the individual cron fields."""

from __future__ import annotations

from dataclasses import dataclass, field


class CronError(ValueError):
    """An invalid cron expression, or one that never fires."""


@dataclass(frozen=True)
class FieldSpec:
    name: str
    low: int
    high: int
    names: dict[str, int] = field(default_factory=dict)


MONTH_NAMES = {
    name: i
    for i, name in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1
    )
}
WEEKDAY_NAMES = {
    name: i for i, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])
}

MINUTE = FieldSpec("minute", 0, 59)
HOUR = FieldSpec("hour", 0, 23)
DAY_OF_MONTH = FieldSpec("day-of-month", 1, 31)
MONTH = FieldSpec("month", 1, 12, MONTH_NAMES)
# 0 and 7 are both Sunday.
DAY_OF_WEEK = FieldSpec("day-of-week", 0, 7, WEEKDAY_NAMES)

FIELDS = (MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK)


def _value(token: str, spec: FieldSpec) -> int:
    key = token.lower()
    if key in spec.names:
        return spec.names[key]
    if not token.isdigit():
        raise CronError(f"invalid {spec.name} value {token!r}")
    n = int(token)
    if not spec.low <= n <= spec.high:
        raise CronError(f"{spec.name} value {n} outside {spec.low}-{spec.high}")
    return n


def parse_field(text: str, spec: FieldSpec) -> frozenset[int]:
    """Expand one field (``*``, ``5``, ``1-5``, ``*/15``, ``10-40/10``, ``mon,wed``...)
    into the set of values it allows."""
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"empty element in {spec.name} field {text!r}")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"invalid step {step_text!r} in {spec.name} field")
            step = int(step_text)
        if base == "*":
            low, high = spec.low, spec.high
        elif "-" in base:
            a, _, b = base.partition("-")
            low, high = _value(a, spec), _value(b, spec)
            if low > high:
                raise CronError(f"backwards range {base!r} in {spec.name} field")
        else:
            low = _value(base, spec)
            # "5/10" means "from 5 to the end, every 10", as in Vixie cron.
            high = spec.high if slash else low
        values.update(range(low, high + 1, step))
    if spec is DAY_OF_WEEK and 7 in values:
        values.discard(7)
        values.add(0)
    return frozenset(values)
