class Playlist:
    songs = []
    _all = []

    def __init__(self, name):
        self.name = name
        Playlist._all.append(self)

    def add(self, song):
        if song in self.songs:
            return False
        self.songs.append(song)
        return True

    def __len__(self):
        return len(self.songs)

    @classmethod
    def total(cls):
        return sum(len(p) for p in cls._all)
