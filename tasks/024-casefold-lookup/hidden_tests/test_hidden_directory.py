from addressbook.directory import Directory


def test_sharp_s_upper():
    assert Directory(["Hauptstraße"]).find("HAUPTSTRASSE") == ["Hauptstraße"]


def test_sharp_s_equivalent():
    d = Directory(["Bahnhofstrasse"])
    assert d.contains("Bahnhofstraße")


def test_search_fragment():
    assert Directory(["Hauptstraße 5"]).search("STRASSE") == ["Hauptstraße 5"]


def test_ascii_search():
    assert Directory(["Elm Road"]).search("elm") == ["Elm Road"]
