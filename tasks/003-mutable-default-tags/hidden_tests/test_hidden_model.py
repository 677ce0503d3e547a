from notes.model import Note


def test_default_tags_not_shared():
    a = Note("a")
    a.tag("todo")
    b = Note("b")
    assert b.tags == []


def test_passed_list_not_aliased():
    mine = ["x"]
    n = Note("n", tags=mine)
    n.tag("y")
    assert mine == ["x"]


def test_untag():
    n = Note("n", tags=["a", "b"])
    n.untag("a")
    assert n.tags == ["b"]


def test_matches_tag():
    assert Note("n", tags=["home"]).matches("home")
