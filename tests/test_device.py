"""--device on a machine without a GPU: auto and cpu run, cuda is one line and exit 2."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from orchestrator.models import load_model, resolve_device
from orchestrator.training.client import ServiceClient

ROOT = Path(__file__).resolve().parent.parent
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")


def test_auto_and_cpu():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match="cpu or cuda"):
        resolve_device("meta")


@no_gpu
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(ValueError, match="no CUDA GPU is usable here"):
        resolve_device("cuda:1")


@no_gpu
@pytest.mark.parametrize("command", ["run", "eval", "train", "serve"])
def test_every_model_command_takes_device(cli, workspace, command):
    # train refuses a team with no training block first, before the model loads: it gets a recipe
    target = {"serve": [], "train": [ROOT / "recipes/guess_number.yaml", "--out", workspace / "run"]}.get(
        command, [workspace / "team.yaml"])
    code, out, err = cli(command, *target, "--model", "tiny", "--device", "cuda", "--no-progress" if command != "serve" else "--port=0")
    assert code == 2 and out == "" and "Traceback" not in err
    [line] = err.strip().splitlines()
    assert line.startswith("rolecast: --device cuda: ") and "no CUDA GPU" in line


def test_models_and_the_training_client_live_on_the_device_asked_for():
    loaded = load_model("tiny", dtype="float32", device="cpu")
    assert next(loaded.model.parameters()).device.type == "cpu"
    service = ServiceClient(loaded, device="cpu")
    try:
        assert service.device == torch.device("cpu")
    finally:
        service.close()
