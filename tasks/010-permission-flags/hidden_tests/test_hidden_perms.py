from acl.perms import READ, WRITE, DELETE, ADMIN, ALL, has_permission, describe


def test_write_granted():
    assert has_permission(READ | WRITE, WRITE)


def test_missing_flag_refused():
    assert not has_permission(READ, WRITE)


def test_combined_needed():
    assert has_permission(ALL, DELETE | ADMIN)
    assert not has_permission(READ | DELETE, DELETE | ADMIN)


def test_describe():
    assert describe(READ | ADMIN) == "read,admin"


def test_empty_grant():
    assert not has_permission(0, READ | WRITE)


def test_read_only():
    assert has_permission(READ, READ)
