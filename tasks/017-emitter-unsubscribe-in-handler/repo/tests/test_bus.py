from eventbus.bus import EventBus


def test_emit_order():
    bus, seen = EventBus(), []
    bus.on("e", lambda p: seen.append(1))
    bus.on("e", lambda p: seen.append(2))
    assert bus.emit("e") == 2 and seen == [1, 2]


def test_off():
    bus, seen = EventBus(), []
    h = bus.on("e", seen.append)
    bus.off("e", h)
    assert bus.emit("e", 1) == 0
