class UsernameTaken(ValueError):
    pass


def canonical(name: str) -> str:
    name = name.strip()
    if not name:
        raise ValueError("empty username")
    return name.lower()


class Registry:
    def __init__(self):
        self._users = {}

    def register(self, name: str) -> str:
        key = canonical(name)
        if key in self._users:
            raise UsernameTaken(name)
        self._users[key] = name.strip()
        return key

    def lookup(self, name: str):
        return self._users.get(canonical(name))

    def __len__(self):
        return len(self._users)
