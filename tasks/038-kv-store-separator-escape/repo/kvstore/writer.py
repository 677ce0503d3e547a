"""Serialise a flat str -> str mapping as lines of KEY<TAB>VALUE."""


def dumps(data: dict[str, str]) -> str:
    lines = []
    for key in sorted(data):
        if "\t" in key or "\n" in key:
            raise ValueError(f"bad key {key!r}")
        lines.append(f"{key}\t{data[key]}")
    return "\n".join(lines) + ("\n" if lines else "")
