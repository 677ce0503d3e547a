"""Turn pydantic validation errors into one-line ``FILE:LINE: KEY: problem`` errors."""
from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from .errors import RolecastError
from .yamlfile import Loc


class ErrorSite(Protocol):
    """Where checked options came from, to word an error at a key: a YAML file (``YamlDoc``:
    FILE:LINE: KEY) or options set after load (``team.with_training_options``: --set KEY)."""

    def error(self, loc: Loc, problem: str) -> RolecastError: ...


def problem_text(err: dict[str, Any], model: type[BaseModel] | None = None) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, err["loc"][:-1]) if model else []
        return "unknown key" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    if kind == "missing":
        return "required key is missing"
    msg = err.get("msg", "invalid value").removeprefix("Value error, ")  # a validator's own words
    if isinstance(err.get("input"), (str, int, float, bool)) or err.get("input", ...) is None:
        shown = repr(err["input"])
        msg += f" (got {shown if len(shown) < 60 else shown[:57] + '...'})"
    return msg


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the sub-model at ``loc`` (best effort: nested models only)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = field.annotation
    return sorted(getattr(current, "model_fields", {}).keys())


def validate_model(model: type[BaseModel], data: Any, doc: ErrorSite, prefix: Loc = ()) -> Any:
    """``model.model_validate(data)``, mapping the first error to the YAML line it concerns."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise doc.error(prefix + tuple(err["loc"]), problem_text(err, model)) from None
