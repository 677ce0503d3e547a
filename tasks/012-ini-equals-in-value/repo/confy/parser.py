class ConfigSyntaxError(ValueError):
    pass


def parse_config(text: str) -> dict[str, dict[str, str]]:
    """Parse an INI-like text: [section] headers, key = value lines, # or ; comments."""
    data: dict[str, dict[str, str]] = {}
    section = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            data.setdefault(section, {})
            continue
        if section is None:
            raise ConfigSyntaxError(f"line {lineno}: key outside of a section")
        if "=" not in line:
            raise ConfigSyntaxError(f"line {lineno}: expected key = value")
        key, value = line.split("=")
        data[section][key.strip().lower()] = value.strip()
    return data


def get_int(data, section, key, default=0):
    try:
        return int(data[section][key])
    except KeyError:
        return default
