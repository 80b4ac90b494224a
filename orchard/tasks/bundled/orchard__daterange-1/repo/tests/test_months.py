from datetime import date

from daterange import add_months, first_of_month, first_of_next_month, last_day_of_month


def test_first_of_month():
    assert first_of_month(date(2024, 5, 17)) == date(2024, 5, 1)


def test_first_of_next_month_december():
    assert first_of_next_month(date(2023, 12, 31)) == date(2024, 1, 1)


def test_last_day_of_month_leap_year():
    assert last_day_of_month(date(2024, 2, 10)) == date(2024, 2, 29)
    assert last_day_of_month(date(2023, 2, 10)) == date(2023, 2, 28)


def test_add_months_clamps_day():
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)
    assert add_months(date(2024, 3, 31), -1) == date(2024, 2, 29)
    assert add_months(date(2023, 11, 30), 2) == date(2024, 1, 30)
