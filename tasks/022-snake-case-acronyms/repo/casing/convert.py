import re


def to_snake(name: str) -> str:
    """camelCase / PascalCase -> snake_case."""
    out = re.sub(r"([A-Z])", r"_\1", name).lower()
    return out.lstrip("_").replace("__", "_")


def to_camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(p.capitalize() for p in rest)
