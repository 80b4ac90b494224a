from datetime import datetime, timedelta, timezone
from itertools import islice

import pytest

from cronparse import CronError, CronExpression, next_run


def test_every_minute_is_strictly_after():
    cron = CronExpression("* * * * *")
    assert cron.next_after(datetime(2024, 5, 1, 10, 0)) == datetime(2024, 5, 1, 10, 1)
    assert cron.next_after(datetime(2024, 5, 1, 10, 0, 59)) == datetime(2024, 5, 1, 10, 1)


def test_business_hours_skip_weekend():
    cron = CronExpression("*/15 9-17 * * mon-fri")
    assert cron.next_after(datetime(2024, 3, 8, 17, 50)) == datetime(2024, 3, 11, 9, 0)
    assert cron.next_after(datetime(2024, 3, 11, 9, 0)) == datetime(2024, 3, 11, 9, 15)


def test_month_and_year_rollover():
    assert next_run("0 0 1 * *", datetime(2024, 1, 31, 12)) == datetime(2024, 2, 1)
    assert next_run("0 0 1 1 *", datetime(2024, 6, 15)) == datetime(2025, 1, 1)
    last_minute = datetime(2024, 12, 31, 23, 59)
    assert next_run("59 23 31 12 *", last_minute) == datetime(2025, 12, 31, 23, 59)


def test_day_of_month_only_skips_short_months():
    assert next_run("30 8 31 * *", datetime(2024, 4, 1)) == datetime(2024, 5, 31, 8, 30)


def test_leap_day():
    assert next_run("0 0 29 2 *", datetime(2024, 3, 1)) == datetime(2028, 2, 29)


def test_day_of_week_only():
    cron = CronExpression("0 12 * * 7")
    assert cron.next_after(datetime(2024, 6, 12)) == datetime(2024, 6, 16, 12, 0)
    assert cron.next_after(datetime(2024, 6, 16, 12, 0)) == datetime(2024, 6, 23, 12, 0)


def test_macros():
    after = datetime(2024, 2, 14, 13, 30)
    assert next_run("@hourly", after) == datetime(2024, 2, 14, 14, 0)
    assert next_run("@daily", after) == datetime(2024, 2, 15)
    assert next_run("@weekly", after) == datetime(2024, 2, 18)
    assert next_run("@monthly", after) == datetime(2024, 3, 1)
    assert next_run("@yearly", after) == datetime(2025, 1, 1)


def test_matches():
    cron = CronExpression("30 6 * jun mon")
    assert cron.matches(datetime(2024, 6, 3, 6, 30, 45))
    assert not cron.matches(datetime(2024, 6, 4, 6, 30))
    assert not cron.matches(datetime(2024, 7, 1, 6, 30))


def test_iter_after():
    cron = CronExpression("0 */8 * * *")
    times = list(islice(cron.iter_after(datetime(2024, 1, 1, 7)), 3))
    assert times == [datetime(2024, 1, 1, 8), datetime(2024, 1, 1, 16), datetime(2024, 1, 2, 0)]


def test_aware_datetime_keeps_tzinfo():
    tz = timezone(timedelta(hours=2))
    result = next_run("0 9 * * *", datetime(2024, 1, 1, 10, tzinfo=tz))
    assert result == datetime(2024, 1, 2, 9, tzinfo=tz)
    assert result.tzinfo is tz


def test_never_firing_expression():
    with pytest.raises(CronError):
        next_run("0 0 30 2 *", datetime(2024, 1, 1))


@pytest.mark.parametrize("text", ["* * * *", "* * * * * *", "", "@often"],
                         ids=["four", "six", "empty", "unknown-macro"])
def test_wrong_field_count(text):
    with pytest.raises(CronError):
        CronExpression(text)
