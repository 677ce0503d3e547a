def mean(values):
    values = list(values)
    if not values:
        raise ValueError("mean of empty data")
    return sum(values) / len(values)


def median(values):
    values = sorted(values)
    if not values:
        raise ValueError("median of empty data")
    return values[len(values) // 2]


def value_range(values):
    values = list(values)
    return max(values) - min(values)


def summary(values):
    values = list(values)
    return {"n": len(values), "mean": mean(values), "median": median(values),
            "range": value_range(values)}
