"""cronparse: 5-field cron expressions and next-run computation."""

from .expr import CronExpression, next_run
from .fields import CronError

__all__ = ["CronError", "CronExpression", "next_run"]
