"""Training metrics: one JSON line per row in metrics.jsonl, and the same scalars for TensorBoard."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, run_dir: Path):
        self.path = run_dir / "metrics.jsonl"
        self.tb_dir = run_dir / "tb"
        self._tb = None

    def write(self, row: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.tb_dir))
        for key, value in row.items():
            if isinstance(value, (int, float)) and key != "step":
                self._tb.add_scalar(key, value, row["step"])
        self._tb.flush()

    def truncate_after(self, step: int) -> None:
        """Drop rows of steps after ``step``: a resumed run redoes them."""
        if not self.path.exists():
            return
        rows = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        self.path.write_text("".join(r + "\n" for r in rows))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
