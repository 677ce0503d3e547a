"""Shared fixtures: a small valid team in a temp folder, and the CLI run in-process."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from orchestrator.cli import main
from support import write


def _share_the_cores() -> None:
    """``make test`` runs a pytest-xdist worker per core: each worker's torch (and the processes
    its tests start) gets its share of the cores. Torch threads that outnumber the cores spin-wait
    for each other, and a tiny model's decode steps turn several times slower."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


_share_the_cores()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A user's folder: an own role (``echo``), a prompt, and a pipeline team using it."""
    write(tmp_path / "prompts" / "echo.md.j2", "Say something about {{ task.text }}.\n{{ schema }}\n")
    write(
        tmp_path / "echo.yaml",
        """
        name: echo
        description: Repeats the task.
        prompt: prompts/echo.md.j2
        output_schema:
          type: object
          properties:
            say: {type: string}
          required: [say]
        policy:
          adapter: null
          sampling: {temperature: 0.0, max_tokens: 16}
        max_retries: 2
        invalid_penalty: -0.5
        """,
    )
    write(
        tmp_path / "team.yaml",
        """
        name: echoes
        protocol:
          type: pipeline
          order: [echo, reviewer]
        roles:
          - use: ./echo.yaml
          - use: reviewer
        tasks:
          - {text: "the sea"}
          - {text: "the sky"}
        """,
    )
    return tmp_path


@pytest.fixture
def cli(capsys):
    """Run ``rolecast ARGS`` in-process; returns (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture
def small_disk(tmp_path):
    """A folder on a 64 KB tmpfs with 16 KB of it free (only root can mount one: skipped elsewhere)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", folder],
                                           capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        (folder / "fill").write_bytes(bytes(48 * 1024))
        yield folder
    finally:
        subprocess.run(["umount", folder], check=True)
