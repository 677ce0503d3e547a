"""examples/fixed_problems.py poses the same problems to the base Solver and to a run's trained one."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import train_tiny

ROOT = Path(__file__).resolve().parents[2]


def test_fixed_problems_example(cli, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, ROOT / "recipes/propose_solve.yaml", run, 1)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "fixed_problems.py"), str(run), "--model", "tiny",
                           "--problems", "3"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    base, trained = map(json.loads, proc.stdout.strip().splitlines())
    assert base["solver"] == "base model" and trained["solver"] == str(run) and trained["problems"] == 3
    episodes = [json.loads(line) for line in (run / "fixed-problems/transcripts.jsonl").read_text().splitlines()]
    posed = sorted((e["index"], json.dumps(e["outcome"]["problem"])) for e in episodes)
    assert len({p for _, p in posed}) == 3  # three different problems, the same ones for both Solvers
    base_dir = next((tmp_path / "runs").glob("eval-propose_solve-*"))
    base_posed = sorted((json.loads(line)["index"], json.dumps(json.loads(line)["outcome"]["problem"]))
                        for line in (base_dir / "transcripts.jsonl").read_text().splitlines())
    assert base_posed == posed
    adapters = {a["adapter"] for e in episodes for t in e["turns"] if t["role"] == "solver" for a in t["attempts"]}
    assert adapters == {"solver"}


def test_fixed_problems_example_runs_again(tmp_path, monkeypatch):
    """A second run over the same run dir evaluates into a new folder: evaluate refuses one that
    holds a run, and the script was a traceback after the base model's evaluation."""
    import importlib.util
    from types import SimpleNamespace

    import rolecast
    from orchestrator.launch import run_dir

    spec = importlib.util.spec_from_file_location("fixed_problems", ROOT / "examples" / "fixed_problems.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    outs = []

    def evaluate(recipe, out=None, **_):  # the refusal evaluate makes, without a model
        if out is not None:
            run_dir(out, "eval", fresh=True).mkdir(parents=True)
            (out / "config.yaml").write_text("{}")
            outs.append(out)
        return SimpleNamespace(report={"roles": {"solver": {"mean_reward": 0.0, "reward_ci95": 0.0}}})

    monkeypatch.setattr(rolecast, "evaluate", evaluate)
    monkeypatch.setattr(sys, "argv", ["fixed_problems.py", str(tmp_path), "--problems", "2"])
    example.main()
    example.main()
    assert outs == [tmp_path / "fixed-problems", tmp_path / "fixed-problems-2"]
