from lrukit.cache import LRUCache


def test_put_get():
    c = LRUCache(2)
    c.put("a", 1)
    assert c.get("a") == 1 and c.get("x") is None
    assert (c.hits, c.misses) == (1, 1)


def test_capacity():
    c = LRUCache(2)
    for k in "abc":
        c.put(k, k)
    assert c.keys() == ["b", "c"]
