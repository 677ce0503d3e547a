"""Training metrics: one JSON line per row in metrics.jsonl, and the same scalars for TensorBoard."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog

from ..errors import RolecastError
from ..files import append_line, write_atomic, writing

log = structlog.get_logger()


def parse_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl. A last line cut off mid-write (the process killed while it
    appended) is dropped with a warning; a bad line before the last is corruption, named here."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RolecastError(f"{path}: cannot read it: {exc}") from None
    lines = [line for line in text.splitlines() if line.strip()]
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if n < len(lines):
                raise RolecastError(f"{path}:{n}: not a JSON row ({exc.msg}): the file is damaged") from None
            log.warning("metrics.cut_off_line_dropped", path=str(path), line=n)
            continue
        if not (isinstance(row, dict) and type(row.get("step")) is int and isinstance(row.get("kind"), str)):
            raise RolecastError(f"{path}:{n}: not a metrics row (a JSON object with an integer step and a kind): "
                                "the file is damaged")
        rows.append(row)
    return rows


class MetricsWriter:
    def __init__(self, run_dir: Path):
        self.path = run_dir / "metrics.jsonl"
        self.tb_dir = run_dir / "tb"
        self._tb = None
        self._purge: int | None = None  # TensorBoard hides the events of steps from here on (truncate_after)

    def write(self, row: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab", buffering=0) as fh:
            append_line(fh, (json.dumps(row) + "\n").encode("utf-8"))
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.tb_dir), purge_step=self._purge)
        with writing(self.tb_dir):  # its writer's thread names no file
            for key, value in row.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tb.add_scalar(tensorboard_tag(row, key), value, row["step"])
            self._tb.flush()

    def truncate_after(self, step: int) -> None:
        """Drop rows of steps after ``step``: a resumed run redoes them. Their TensorBoard events
        are in the stopped run's event file, so they are purged from the display instead."""
        self._purge = step + 1
        if not self.path.exists():
            return
        rows = [row for row in parse_rows(self.path) if row["step"] <= step]
        write_atomic(self.path, "".join(json.dumps(row) + "\n" for row in rows))

    def close(self) -> None:
        if self._tb is not None:
            with writing(self.tb_dir):
                self._tb.close()


def tensorboard_tag(row: dict[str, Any], key: str) -> str:
    """``key``'s tag in TensorBoard: an eval row's counts a train row also has (``episodes``,
    ``engine/...``) get ``eval_``, as its own metrics have, or one curve would mix the two at a step."""
    return f"eval_{key}" if row["kind"] == "eval" and not key.startswith("eval_") else key


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return parse_rows(run_dir / "metrics.jsonl")
