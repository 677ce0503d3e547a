"""examples/two_agent_debate.py runs on the tiny model and saves both adapters."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_two_agent_debate_example(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "two_agent_debate.py"), "--model", "tiny",
                           "--steps", "1", "--debates", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "step 1 pro" in proc.stdout and "step 1 con" in proc.stdout
    for name in ("pro", "con"):
        state = json.loads((tmp_path / "final" / name / "state.json").read_text())
        assert state["adapter"] == name and state["step"] == 1
        assert (tmp_path / "final" / name / "adapter_model.safetensors").stat().st_size > 0
