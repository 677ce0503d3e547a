"""Policies: what produces a role's text (the model engine, a Python callable, a replay file)."""
from .base import Policy, PolicyOutput, PolicyRequest
from .binding import Binding, parse_binding

__all__ = ["Policy", "PolicyOutput", "PolicyRequest", "Binding", "parse_binding"]
