from addressbook.directory import Directory


def test_ascii_case():
    assert Directory(["Main Street"]).find("main   STREET") == ["Main Street"]


def test_no_duplicates():
    d = Directory(["A", "a"])
    assert d.find("a") == ["A"]
