from notes.model import Note


def test_tag_normalises():
    n = Note("x", tags=[])
    n.tag(" Work ", "work", "")
    assert n.tags == ["work"]


def test_matches_body():
    assert Note("t", body="Buy MILK", tags=[]).matches("milk")
