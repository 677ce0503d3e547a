from music.playlist import Playlist


def test_add_once():
    p = Playlist("p")
    assert p.add("x-unique-song") is True
    assert p.add("x-unique-song") is False
