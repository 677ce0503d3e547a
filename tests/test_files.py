"""files.py: a run's records read back as they were written, whichever YAML backend PyYAML has."""
from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest
import yaml
from orchestrator import files
from orchestrator.team import load_team


def test_config_yaml_reads_back_and_reads_as_pure_python_yaml_wrote_it(tmp_path):
    config = {"team": load_team(Path(__file__).parents[1] / "recipes" / "debate.yaml").resolved(),
              "run": {"seed": 3, "note": "é ± 漢字 🙂\nsecond line  \n", "empty": "", "tasks": [{"n": 1}, {}]}}
    files.write_yaml(tmp_path / "config.yaml", config)
    text = (tmp_path / "config.yaml").read_text(encoding="utf-8")
    assert text == yaml.safe_dump(config, sort_keys=False, allow_unicode=True)  # libyaml's emitter changes nothing
    assert files.read_yaml(tmp_path / "config.yaml") == config


@pytest.mark.parametrize("fault", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), KeyboardInterrupt()],
                         ids=["disk-full", "ctrl-c"])
def test_a_write_the_disk_refuses_keeps_the_old_file_and_leaves_no_half_copy(tmp_path, monkeypatch, fault):
    """A Ctrl-C mid-write (no Exception) leaves no half copy either."""
    (tmp_path / "summary.json").write_text("old")

    def full(fd):
        raise fault

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(type(fault)):
        files.write_atomic(tmp_path / "summary.json", "new")
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # a .summary.json.tmp filled the disk's last room
    assert (tmp_path / "summary.json").read_text() == "old"


def test_a_line_the_disk_takes_part_of_is_cut_back_and_the_next_lands_where_it_began(tmp_path):
    """append_line on a file opened for writing, not appending (a run's transcripts.jsonl): cut
    back but left at the old end, the next line went after a run of NUL bytes."""

    class Filling(io.FileIO):
        room = 3  # bytes the disk takes before it is full

        def write(self, data):
            if self.room == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            taken = super().write(bytes(data[: self.room]))
            self.room -= taken
            return taken

    path = tmp_path / "transcripts.jsonl"
    with Filling(path, "wb") as fh:
        fh.room = 100
        files.append_line(fh, b'{"n": 1}\n')
        fh.room = 3
        with pytest.raises(OSError) as refused:
            files.append_line(fh, b'{"n": 2}\n')
        assert refused.value.filename == str(path) and path.read_bytes() == b'{"n": 1}\n'
        fh.room = 100  # the user made room
        files.append_line(fh, b'{"n": 3}\n')
    assert path.read_bytes() == b'{"n": 1}\n{"n": 3}\n'


def test_an_error_naming_its_own_file_keeps_it():
    with pytest.raises(OSError) as refused, files.writing(Path("outer.json")):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "inner.json")
    assert refused.value.filename == "inner.json"


def test_fsync_dir_syncs_each_file_in_it_and_the_dir_itself(tmp_path, monkeypatch):
    (tmp_path / "a.pt").write_bytes(b"a")
    (tmp_path / "b.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    synced: list[str] = []
    fsync = os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd)))
    files.fsync_dir(tmp_path)
    assert sorted(synced) == sorted(str(tmp_path / name) for name in ("a.pt", "b.json", ""))


def test_a_saved_file_that_cannot_be_read_is_the_os_error_not_damaged(tmp_path):
    """A missing or unreadable file is the OSError it is (cli.main names the file), not 'damaged'."""
    with pytest.raises(FileNotFoundError):
        files.read_saved(tmp_path / "gone.pt", lambda p: p.read_bytes())
    (tmp_path / "cut.json").write_text('{"step": ')
    with pytest.raises(ValueError, match=r"cut\.json is damaged \(JSONDecodeError"):
        files.read_saved(tmp_path / "cut.json", lambda p: json.loads(p.read_text()))
