"""The random state a checkpoint keeps, so that ``--resume`` draws what the run would have drawn."""
from __future__ import annotations

import random
from pathlib import Path

import torch

from ..files import save_torch


def seed_rng(seed: int) -> None:
    """A fresh run's generators from its seed: torch starts from the OS's entropy, and LoRA
    dropout draws from it, so two runs with one seed would differ, and a resumed run from both."""
    torch.manual_seed(seed)
    random.seed(seed)


def save_rng(path: Path) -> None:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():  # dropout and sampling on a GPU draw from its own generators
        state["cuda"] = torch.cuda.get_rng_state_all()
    save_torch(state, path)


def read_rng(path: Path) -> dict:
    return torch.load(path, weights_only=False)


def set_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_rng(path: Path) -> None:
    set_rng(read_rng(path))
