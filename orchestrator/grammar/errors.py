"""The grammar package's error, apart so that every module of it can raise it."""
from __future__ import annotations


class GrammarError(ValueError):
    """A schema xgrammar cannot compile (or would not enforce), or a reply prefix the schema does
    not allow."""

    def __init__(self, message: str, key: str = "output_schema"):
        super().__init__(message)
        self.key = key  # the role key at fault
