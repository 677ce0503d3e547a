import pytest
from accounts.registry import Registry, UsernameTaken


def test_register_and_lookup():
    r = Registry()
    r.register(" Alice ")
    assert r.lookup("ALICE") == "Alice"


def test_taken_case_insensitive():
    r = Registry()
    r.register("bob")
    with pytest.raises(UsernameTaken):
        r.register("Bob")
