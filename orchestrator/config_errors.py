"""Turn pydantic validation errors into one-line ``FILE:LINE: KEY: problem`` errors."""
from __future__ import annotations

import typing
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from .config import set_by_train
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
        msg += f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
    return msg


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names a recipe may give the sub-model at ``loc`` (best effort: nested models, optional
    ones included; not those `rolecast train` sets)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(_model(current), "model_fields", {}).get(part)
        if field is None:
            return []
        current = field.annotation
    model = _model(current)
    if model is None:
        return []
    taken = set_by_train(model)
    return sorted(f.alias or name for name, f in model.model_fields.items() if name not in taken)  # as a file spells them


def _model(annotation: Any) -> type[BaseModel] | None:
    """The model ``annotation`` names, or the model in ``Model | None``."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def first_error(exc: ValidationError, data: Any, model: type[BaseModel]) -> tuple[tuple, str]:
    """Where in ``data`` (keys and indexes) the first error of validating it as ``model`` is, and
    what it is, in words."""
    err = exc.errors()[0]
    return data_loc(err, data), problem_text(err, model)


def data_loc(err: dict[str, Any], data: Any) -> tuple:
    """The error's location as keys and indexes of ``data``: pydantic adds a union member's name
    (``tasks.list[dict[str,any]][0]``), which no YAML file has, where a union field fails."""
    loc, at = [], data
    for i, part in enumerate(err["loc"]):
        if isinstance(at, dict) and part in at or isinstance(at, list) and isinstance(part, int) and part < len(at):
            at = at[part]
        elif not (i == len(err["loc"]) - 1 and err.get("type") == "missing"):  # a missing key is named, not in data
            continue
        loc.append(part)
    return tuple(loc)


def validate_model(model: type[BaseModel], data: Any, doc: ErrorSite, prefix: Loc = ()) -> Any:
    """``model.model_validate(data)``, mapping the first error to the YAML line it concerns."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        loc, problem = first_error(exc, data, model)
        raise doc.error(prefix + loc, problem) from None
