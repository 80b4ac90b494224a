"""daterange: inclusive date ranges, month splitting and business days."""

from .business import add_business_days, business_days, is_business_day
from .months import add_months, first_of_month, first_of_next_month, last_day_of_month
from .range import DateRange

__all__ = [
    "DateRange",
    "add_business_days",
    "add_months",
    "business_days",
    "first_of_month",
    "first_of_next_month",
    "is_business_day",
    "last_day_of_month",
]
__version__ = "0.6.2"
