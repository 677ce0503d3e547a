"""Parse what writer.dumps produced."""


def loads(text: str) -> dict[str, str]:
    data = {}
    for line in text.split("\n"):
        if not line:
            continue
        key, _, value = line.partition("\t")
        data[key] = value
    return data
