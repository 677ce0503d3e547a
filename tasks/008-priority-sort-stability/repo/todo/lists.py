from dataclasses import dataclass


@dataclass
class Item:
    title: str
    priority: int = 0
    done: bool = False


class TodoList:
    def __init__(self):
        self.items: list[Item] = []

    def add(self, title, priority=0):
        item = Item(title, priority)
        self.items.append(item)
        return item

    def ordered(self, include_done=False):
        """Highest priority first; ties keep insertion order."""
        items = [i for i in self.items if include_done or not i.done]
        return sorted(items, key=lambda i: i.priority)[::-1]

    def top(self, n):
        return self.ordered()[:n]
