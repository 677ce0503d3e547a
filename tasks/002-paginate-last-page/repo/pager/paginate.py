class PageError(IndexError):
    pass


class Paginator:
    def __init__(self, items, per_page=10):
        if per_page < 1:
            raise ValueError("per_page must be >= 1")
        self.items = list(items)
        self.per_page = per_page

    @property
    def num_pages(self) -> int:
        if not self.items:
            return 1
        return len(self.items) // self.per_page

    def page(self, number: int) -> list:
        if number < 1 or number > self.num_pages:
            raise PageError(f"page {number} out of range")
        start = (number - 1) * self.per_page
        return self.items[start:start + self.per_page]

    def has_next(self, number: int) -> bool:
        return number < self.num_pages
