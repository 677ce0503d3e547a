from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes import Limits, SandboxResult, run

BACKENDS = [
    "unshare",
    pytest.param("bwrap", marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap not installed")),
]
PY = sys.executable

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="isolating backends need root")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "work"
    wd.mkdir()
    return wd


@pytest.fixture
def marker() -> str:
    return f"rolecast-marker-{uuid.uuid4().hex}"


@pytest.fixture
def sandbox(backend: str, workdir: Path):
    def go(command: str | list[str], **limits: object) -> SandboxResult:
        return run(command, workdir, Limits(**{"wall_time_s": 3.0, **limits}), backend=backend)  # type: ignore[arg-type]

    return go


@pytest.fixture
def host_process(marker: str) -> Iterator[subprocess.Popen[bytes]]:
    """A host process holding a secret in its environment and the marker in its argv."""
    proc = subprocess.Popen(
        [PY, "-c", "import time; time.sleep(60)", marker],
        env={**os.environ, "ROLECAST_TEST_SECRET": marker + "-secret"},
    )
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def processes_with():
    return _processes_with


def _processes_with(text: str) -> list[int]:
    """Host pids whose command line contains ``text`` (the scan is from the host's /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found
