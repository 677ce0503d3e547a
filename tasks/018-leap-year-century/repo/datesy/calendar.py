_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap(year: int) -> bool:
    return year % 4 == 0


def days_in_month(year: int, month: int) -> int:
    if not 1 <= month <= 12:
        raise ValueError(f"bad month {month}")
    if month == 2 and is_leap(year):
        return 29
    return _DAYS[month - 1]


def day_of_year(year: int, month: int, day: int) -> int:
    if not 1 <= day <= days_in_month(year, month):
        raise ValueError(f"bad day {day}")
    return sum(days_in_month(year, m) for m in range(1, month)) + day
