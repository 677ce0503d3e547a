"""The grammar package's error, apart so that every module of it can raise it."""
from __future__ import annotations

import re


class GrammarError(ValueError):
    """A schema xgrammar cannot compile (or would not enforce), or a reply prefix the schema does
    not allow."""

    def __init__(self, message: str, key: str = "output_schema"):
        super().__init__(message)
        self.key = key  # the role key at fault


CYCLE = ("the schema allows no message: a $ref cycle has no way out (a $ref to itself, or a required property "
         "of its own object's type): make the recursion optional")


def compile_error(exc: RuntimeError) -> GrammarError:
    """xgrammar's refusal as one line, without its C++ prefix ("[12:00:00] path.cc:3562: ",
    whichever of the two its version writes); a $ref cycle worded as the check that finds it
    first on older versions (0.2.9 refuses it itself)."""
    text = re.sub(r"^\S+\.cc:\d+: ", "", str(exc).split("] ")[-1]).strip()
    if text.startswith("Circular $ref"):
        return GrammarError(CYCLE)
    return GrammarError(f"xgrammar cannot compile this schema: {text[:300]}")
