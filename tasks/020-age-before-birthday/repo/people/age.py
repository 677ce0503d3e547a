from datetime import date


def age_on(born: date, today: date) -> int:
    if today < born:
        raise ValueError("born in the future")
    return today.year - born.year


def is_adult(born: date, today: date, threshold: int = 18) -> bool:
    return age_on(born, today) >= threshold
