from datetime import date

from daterange import DateRange, add_business_days, business_days, is_business_day


def test_weekend_is_not_business_day():
    assert is_business_day(date(2024, 6, 7))       # Friday
    assert not is_business_day(date(2024, 6, 8))   # Saturday


def test_business_days_with_holiday():
    r = DateRange(date(2024, 5, 24), date(2024, 5, 31))
    days = business_days(r, holidays={date(2024, 5, 27)})
    assert days == [date(2024, 5, 24), date(2024, 5, 28), date(2024, 5, 29),
                    date(2024, 5, 30), date(2024, 5, 31)]


def test_add_business_days_skips_weekend():
    assert add_business_days(date(2024, 6, 7), 1) == date(2024, 6, 10)
    assert add_business_days(date(2024, 6, 10), -1) == date(2024, 6, 7)
    assert add_business_days(date(2024, 6, 8), 0) == date(2024, 6, 8)
