from music.playlist import Playlist


def test_playlists_independent():
    rock, jazz = Playlist("rock"), Playlist("jazz")
    rock.add("Paranoid")
    assert jazz.songs == []


def test_len_per_playlist():
    a, b = Playlist("a"), Playlist("b")
    a.add("1")
    a.add("2")
    b.add("3")
    assert (len(a), len(b)) == (2, 1)


def test_same_song_two_playlists():
    a, b = Playlist("a"), Playlist("b")
    assert a.add("song") and b.add("song")


def test_name():
    assert Playlist("chill").name == "chill"
