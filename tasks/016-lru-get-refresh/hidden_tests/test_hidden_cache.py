from lrukit.cache import LRUCache


def test_get_protects_from_eviction():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.get("a")
    c.put("c", 3)
    assert c.get("a") == 1
    assert c.get("b") is None


def test_keys_order_after_get():
    c = LRUCache(3)
    for k in "xyz":
        c.put(k, 0)
    c.get("x")
    assert c.keys() == ["y", "z", "x"]


def test_update_refreshes():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)
    c.put("c", 3)
    assert c.keys() == ["a", "c"] and c.get("a") == 10


def test_len():
    c = LRUCache(1)
    c.put(1, 1)
    c.put(2, 2)
    assert len(c) == 1
