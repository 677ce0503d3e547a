"""CPU feature checks: what /proc/cpuinfo says each machine of this project can run."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from orchestrator import cpu as cpu_module
from orchestrator.cpu import CpuFeatures, host
from orchestrator.models import resolve_dtype

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx fma avx2 bmi2 sha_ni vaes
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu sse sse2 avx fma avx2 bmi2 sha_ni vaes
"""
SAPPHIRE_RAPIDS = "processor: 0\nflags: avx2 avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_bf16 amx_tile\n"
AVX_NE = "flags: avx2 avx_vnni avx_ne_convert\n"  # an AVX2-only core with the bf16 conversions oneDNN needs


def test_an_avx2_epyc_has_no_bf16_kernels():
    cpu = CpuFeatures.from_cpuinfo(EPYC)
    assert "avx2" in cpu.flags and "avx512bw" not in cpu.flags
    assert not cpu.native_bf16 and not cpu.onednn_bf16


def test_avx512_bf16_cpu_has_both():
    cpu = CpuFeatures.from_cpuinfo(SAPPHIRE_RAPIDS)
    assert cpu.native_bf16 and cpu.onednn_bf16
    assert not CpuFeatures.from_cpuinfo(SAPPHIRE_RAPIDS, onednn=False).onednn_bf16  # a torch built without oneDNN


def test_avx_ne_convert_is_enough_for_onednn_bf16():
    cpu = CpuFeatures.from_cpuinfo(AVX_NE)
    assert cpu.onednn_bf16 and not cpu.native_bf16


KNIGHTS_LANDING = "flags: avx2 fma avx512f avx512cd avx512er avx512pf\n"  # AVX-512 without BW, VL, DQ


@pytest.mark.parametrize("flags", [KNIGHTS_LANDING, "flags: avx512f avx512bw avx512vl\n", "flags: avx512bw avx512dq\n"])
def test_part_of_the_avx512_set_is_no_onednn_bf16(flags):
    """oneDNN's bf16 kernels need all of avx512bw, avx512vl and avx512dq: any one of them, or
    avx512f alone, would prepack bf16 weights that raise at the first step."""
    assert not CpuFeatures.from_cpuinfo(flags).onednn_bf16


def test_either_native_bf16_flag_is_enough():
    assert CpuFeatures(frozenset({"amx_bf16"})).native_bf16 and CpuFeatures(frozenset({"avx512_bf16"})).native_bf16


def test_unreadable_cpuinfo_promises_nothing(monkeypatch):
    cpu = CpuFeatures.from_cpuinfo("")
    assert cpu.flags == frozenset() and not cpu.onednn_bf16

    class NoProc(type(Path())):  # a machine without /proc (macOS, a sandbox)
        def read_text(self, *args, **kwargs):
            raise FileNotFoundError(self)

    monkeypatch.delenv("ROLECAST_CPU_FLAGS", raising=False)
    monkeypatch.setattr(cpu_module, "Path", NoProc)
    host.cache_clear()
    try:
        assert host().flags == frozenset() and not host().native_bf16 and not host().onednn_bf16
    finally:
        monkeypatch.undo()
        host.cache_clear()


def test_a_torch_without_onednn_prepack_is_seen(monkeypatch):
    """A torch built without oneDNN (or without its linear prepack ops): host() says so, and
    the engine lays its weights out plain instead of calling ops that are not there."""
    monkeypatch.setenv("ROLECAST_CPU_FLAGS", "avx2 fma avx512bw avx512vl avx512dq")
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    host.cache_clear()
    try:
        assert not host().onednn and not host().onednn_bf16
        monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
        monkeypatch.setattr(torch.ops, "mkldnn", SimpleNamespace())  # no _reorder_linear_weight
        host.cache_clear()
        assert not host().onednn
    finally:
        monkeypatch.undo()
        host.cache_clear()


@pytest.mark.parametrize("flags, dtype", [("avx2 fma avx512f avx512_bf16", torch.bfloat16), ("avx2 fma", torch.float32)])
def test_auto_dtype_is_bf16_only_where_the_cpu_has_bf16_math(monkeypatch, flags, dtype):
    monkeypatch.setenv("ROLECAST_CPU_FLAGS", flags)
    host.cache_clear()
    try:
        assert resolve_dtype("auto", torch.device("cpu")) == dtype
        assert resolve_dtype("float32", torch.device("cpu")) == torch.float32  # an explicit dtype is kept
    finally:
        monkeypatch.undo()
        host.cache_clear()


def test_rolecast_cpu_flags_stands_in_for_the_machines_flags(monkeypatch):
    monkeypatch.setenv("ROLECAST_CPU_FLAGS", "avx2 fma")
    host.cache_clear()
    try:
        assert host().flags == frozenset({"avx2", "fma"}) and not host().native_bf16 and not host().onednn_bf16
        monkeypatch.setenv("ROLECAST_CPU_FLAGS", "AVX512F,AVX512_BF16")  # as a CPU's manual writes them
        host.cache_clear()
        assert host().flags == frozenset({"avx512f", "avx512_bf16"}) and host().native_bf16
        monkeypatch.setenv("ROLECAST_CPU_FLAGS", "")  # set, and empty: a CPU with none, every fallback
        host.cache_clear()
        assert host().flags == frozenset() and not host().native_bf16 and not host().onednn_bf16
        monkeypatch.delenv("ROLECAST_CPU_FLAGS")
        host.cache_clear()
        assert host().flags == CpuFeatures.from_cpuinfo(Path("/proc/cpuinfo").read_text()).flags
    finally:
        monkeypatch.undo()  # the environment as it was (make test's AVX2 run sets the variable)
        host.cache_clear()
