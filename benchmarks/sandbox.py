"""Sandbox overhead: the same small pytest project, sandboxed vs a bare subprocess.

Runs alternate (bare, sandbox, bare, ...) so machine noise hits both alike; prints
per-run timings and, last, one JSON line with the MEDIAN wall time per run of each.
Usage: python benchmarks/sandbox.py [--runs N] [--backend B] [--smoke]

``--smoke``: one counted run: seconds, to check that the script still runs (tests/test_benchmarks.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from sandboxes import Limits, SandboxError, run, select_backend

from orchestrator.cli.flags import positive_int

TESTS = textwrap.dedent(
    """
    import json, math, pytest

    def test_math():
        assert math.isclose(sum(1 / 2**i for i in range(60)), 2)

    @pytest.mark.parametrize("n", range(20))
    def test_json_round_trip(n):
        data = {"n": n, "items": list(range(n))}
        assert json.loads(json.dumps(data)) == data

    def test_tmp(tmp_path):
        (tmp_path / "f").write_text("x")
        assert (tmp_path / "f").read_text() == "x"
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=positive_int, default=10)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--smoke", action="store_true", help="seconds: does the script still run")
    opts = parser.parse_args()
    if opts.smoke:
        opts.runs = 1
    try:
        select_backend(opts.backend)
    except SandboxError as exc:
        sys.exit(f"--backend {opts.backend}: {exc}")

    with tempfile.TemporaryDirectory(prefix="rolecast-bench-") as tmp:
        project = Path(tmp)
        (project / "test_small.py").write_text(TESTS)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_small.py"]
        limits = Limits(wall_time_s=60)
        bare_s: list[float] = []
        sandbox_s: list[float] = []
        backend = ""
        for i in range(opts.runs + 1):  # run 0 warms caches and is not counted
            start = time.perf_counter()
            bare = subprocess.run(cmd, cwd=project, capture_output=True)
            bare_t = time.perf_counter() - start
            start = time.perf_counter()
            res = run(cmd, project, limits, backend=opts.backend)
            sand_t = time.perf_counter() - start
            if bare.returncode != 0 or res.exit_code != 0:
                sys.exit(f"run failed: bare={bare.returncode} sandbox={res.exit_code}\n{res.stdout}{res.stderr}")
            backend = res.backend
            if i:
                bare_s.append(bare_t)
                sandbox_s.append(sand_t)
                print(f"run {i}: bare {bare_t:.3f}s sandbox {sand_t:.3f}s", file=sys.stderr)

    b, s = statistics.median(bare_s), statistics.median(sandbox_s)
    print(json.dumps({
        "sandbox_s": round(s, 4), "bare_s": round(b, 4), "ratio": round(s / b, 3),
        "backend": backend, "runs": opts.runs, "stat": "median",
    }))


if __name__ == "__main__":
    main()
