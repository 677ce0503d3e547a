from acl.perms import READ, parse, has_permission


def test_parse():
    assert parse("read, write") == 3


def test_read():
    assert has_permission(READ, READ)
