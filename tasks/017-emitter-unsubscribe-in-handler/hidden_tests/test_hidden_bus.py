from eventbus.bus import EventBus


def test_self_removal_does_not_skip_next():
    bus, calls = EventBus(), []

    def once(p):
        calls.append("once")
        bus.off("ping", once)

    bus.on("ping", once)
    bus.on("ping", lambda p: calls.append("second"))
    bus.emit("ping")
    assert calls == ["once", "second"]


def test_once_helper():
    bus, calls = EventBus(), []
    bus.once("e", lambda p: calls.append("a"))
    bus.on("e", lambda p: calls.append("b"))
    bus.emit("e")
    bus.emit("e")
    assert calls == ["a", "b", "b"]


def test_emit_count_with_once():
    bus = EventBus()
    bus.once("e", lambda p: None)
    bus.on("e", lambda p: None)
    assert bus.emit("e") == 2


def test_unknown_event():
    assert EventBus().emit("nothing") == 0
