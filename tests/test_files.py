"""files.py: a run's records read back as they were written, whichever YAML backend PyYAML has."""
from __future__ import annotations

import errno
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


def test_a_write_the_disk_refuses_keeps_the_old_file_and_leaves_no_half_copy(tmp_path, monkeypatch):
    (tmp_path / "summary.json").write_text("old")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError):
        files.write_atomic(tmp_path / "summary.json", "new")
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # a .summary.json.tmp filled the disk's last room
    assert (tmp_path / "summary.json").read_text() == "old"
