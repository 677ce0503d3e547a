class Note:
    def __init__(self, title, body="", tags=[]):
        self.title = title
        self.body = body
        self.tags = tags

    def tag(self, *names):
        for name in names:
            name = name.strip().lower()
            if name and name not in self.tags:
                self.tags.append(name)
        return self

    def untag(self, name):
        if name in self.tags:
            self.tags.remove(name)
        return self

    def matches(self, query):
        q = query.lower()
        return q in self.title.lower() or q in self.body.lower() or q in self.tags
