import pytest
from accounts.registry import Registry, UsernameTaken


def test_decomposed_duplicate_rejected():
    r = Registry()
    r.register("Jos\u00e9")
    with pytest.raises(UsernameTaken):
        r.register("Jose\u0301")


def test_lookup_either_form():
    r = Registry()
    r.register("Jose\u0301")
    assert r.lookup("jos\u00e9") == "Jose\u0301"


def test_distinct_names_ok():
    r = Registry()
    r.register("Jose")
    r.register("Jos\u00e9")
    assert len(r) == 2


def test_empty_rejected():
    with pytest.raises(ValueError):
        Registry().register("   ")
