def normalize(name: str) -> str:
    """Key used for case-insensitive comparisons."""
    return " ".join(name.split()).lower()


class Directory:
    def __init__(self, names=()):
        self._names = []
        for n in names:
            self.add(n)

    def add(self, name: str) -> None:
        if not self.contains(name):
            self._names.append(name)

    def contains(self, name: str) -> bool:
        return bool(self.find(name))

    def find(self, query: str) -> list[str]:
        key = normalize(query)
        return [n for n in self._names if normalize(n) == key]

    def search(self, fragment: str) -> list[str]:
        key = normalize(fragment)
        return [n for n in self._names if key in normalize(n)]
