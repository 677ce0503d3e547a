class EventBus:
    def __init__(self):
        self._handlers = {}

    def on(self, event, handler):
        self._handlers.setdefault(event, []).append(handler)
        return handler

    def off(self, event, handler):
        handlers = self._handlers.get(event, [])
        if handler in handlers:
            handlers.remove(handler)

    def once(self, event, handler):
        def wrapper(payload):
            self.off(event, wrapper)
            return handler(payload)
        return self.on(event, wrapper)

    def emit(self, event, payload=None):
        """Call every handler of ``event`` in subscription order; return how many ran."""
        count = 0
        for handler in self._handlers.get(event, []):
            handler(payload)
            count += 1
        return count
