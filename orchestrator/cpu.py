"""What this CPU can run: the facts that pick rolecast's ISA-specific CPU kernels.

x86-64 machines of one kind differ. bf16 arithmetic is native only with AVX512-BF16 or AMX
(elsewhere torch emulates it, correctly but slowly), and oneDNN's prepacked bf16 linear weights
(``torch.ops.mkldnn._reorder_linear_weight``) need AVX512 BW/VL/DQ or AVX-NE-CONVERT: on an
AVX2-only CPU they raise. Code that calls such a kernel takes a :class:`CpuFeatures` (default:
:func:`host`), so tests can hand it another CPU's flags and run the fallback on any machine.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

# oneDNN's bf16 reorder and matmul kernels: either of these sets (torch's own check, see the error
# "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq").
_ONEDNN_BF16 = (frozenset({"avx_ne_convert"}), frozenset({"avx512bw", "avx512vl", "avx512dq"}))
_NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})


@dataclass(frozen=True)
class CpuFeatures:
    flags: frozenset[str]  # as /proc/cpuinfo names them
    onednn: bool = True  # torch was built with oneDNN and exposes its linear prepack ops

    @property
    def native_bf16(self) -> bool:
        """bf16 matmuls run natively (else emulated: pick fp32 where the dtype is ours to choose)."""
        return bool(self.flags & _NATIVE_BF16)

    @property
    def onednn_bf16(self) -> bool:
        """oneDNN can prepack bf16 weights and multiply by them."""
        return self.onednn and any(need <= self.flags for need in _ONEDNN_BF16)

    @classmethod
    def from_cpuinfo(cls, text: str, onednn: bool = True) -> CpuFeatures:
        """The flags of the first processor listed (every core of a machine has the same)."""
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags":
                return cls(frozenset(value.split()), onednn)
        return cls(frozenset(), onednn)


@lru_cache(maxsize=1)
def host() -> CpuFeatures:
    """This machine's CPU (no flags where /proc/cpuinfo cannot be read: every check says no).

    ``ROLECAST_CPU_FLAGS`` (flag names as /proc/cpuinfo writes them, space- or comma-separated,
    in any case) stands in for the machine's flags, in this process and those it starts: ``make
    test`` runs part of the suite with ``avx2 fma``, an AVX2-only machine's fallbacks, whatever CPU
    it runs on; set and empty, it is a CPU with no flags (every fallback). A name no check knows
    ("avx512-bf16") is kept, and silently promises nothing.
    """
    onednn = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    if (flags := os.environ.get("ROLECAST_CPU_FLAGS")) is not None:
        return CpuFeatures(frozenset(flags.lower().replace(",", " ").split()), onednn)
    try:
        return CpuFeatures.from_cpuinfo(Path("/proc/cpuinfo").read_text(), onednn)
    except OSError:
        return CpuFeatures(frozenset(), onednn)
