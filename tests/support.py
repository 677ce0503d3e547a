"""Helpers the tests import (conftest.py modules are not importable by name across folders)."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import torch
from orchestrator.cpu import CpuFeatures

ERROR_LINE = re.compile(r"^(?P<file>[^:\n]+)(?::(?P<line>\d+))?: (?P<key>\S+): (?P<problem>.+)$")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def _bf16_runs() -> bool:
    try:
        torch.ones(2, 2, dtype=torch.bfloat16) @ torch.ones(2, 2, dtype=torch.bfloat16)
        return True
    except RuntimeError:
        return False


# bf16-only tests: skipped, with the reason, on a CPU where torch cannot multiply bf16 at all
requires_bf16 = pytest.mark.skipif(not _bf16_runs(), reason="torch cannot run bf16 matmuls on this CPU")

# Other machines' CPUs, handed to the engine so every weight layout runs on this one (cpu.py)
AVX512 = CpuFeatures(frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}))
AVX2 = CpuFeatures(frozenset({"avx2", "fma"}))  # an AMD EPYC of this project's: no oneDNN bf16 kernels
NO_ONEDNN = CpuFeatures(frozenset({"avx2"}), onednn=False)
