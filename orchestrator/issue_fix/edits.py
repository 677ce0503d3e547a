"""Search/replace edits of files in a work directory, each applied exactly or reported as failed.

An edit is ``{"path", "search", "replace"}``: ``search`` must occur exactly once in the file and
is replaced by ``replace``; an empty ``search`` creates a new file holding ``replace``. Edits
apply in order, each to the result of the ones before. Nothing is dropped silently: every edit
gets an :class:`EditResult` whose message says what happened or why not.
"""
from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

MAX_FILE_BYTES = 1_000_000  # a file a model edits is source code, not data


@dataclass
class EditResult:
    path: str
    ok: bool
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PathRefused(ValueError):
    """A path that leaves the work directory, or is not a plain file."""


def resolve_in(root: Path, rel: str) -> Path:
    """``root/rel``, refused when ``rel`` is absolute, climbs with ``..`` or leads out via a symlink.

    Sandboxed code writes into ``root`` too, so symlinks there are hostile: the resolved path
    (links followed) must stay inside the resolved root.
    """
    rel = rel.strip()
    pure = PurePosixPath(rel)
    if not rel or pure.is_absolute() or ".." in pure.parts or "\\" in rel:
        raise PathRefused(f"path {rel!r} must be relative to the repository root, without '..'")
    if "\0" in rel:
        raise PathRefused(f"path {rel!r} holds a NUL character")
    base = root.resolve()
    try:
        target = (base / pure).resolve()
    except OSError as exc:  # a name too long, a symlink loop
        raise PathRefused(f"path {rel!r}: {exc.strerror or exc}") from None
    if target == base or not target.is_relative_to(base):
        raise PathRefused(f"path {rel!r} leads outside the repository")
    return target


def is_regular(path: Path) -> bool:
    """A regular file, not a link, FIFO or device (which a sandboxed run may leave)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_regular(path: Path, limit: int = MAX_FILE_BYTES) -> bytes | None:
    """The bytes of a regular file (see :func:`is_regular`), else ``None``."""
    if not is_regular(path):
        return None
    with open(path, "rb") as fh:
        return fh.read(limit)


def apply_edit(root: Path, path: str, search: str, replace: str) -> EditResult:
    """One edit (see the module doc); whatever a model sends, the answer is a result, not a raise."""
    try:
        return _apply(resolve_in(root, path), path, search, replace)
    except PathRefused as exc:
        return EditResult(path, False, str(exc))
    except OSError as exc:  # a name too long, a file where a folder is needed
        return EditResult(path, False, f"{path}: {exc.strerror or exc}")
    except UnicodeEncodeError:  # a lone surrogate from a JSON escape (raised before any write)
        return EditResult(path, False, f"{path}: `replace` is not valid Unicode text")


def _apply(target: Path, path: str, search: str, replace: str) -> EditResult:
    if search and search == replace:  # it would count as applied, and pay the Coder, for doing nothing
        return EditResult(path, False, f"`search` and `replace` are the same: the edit changes nothing in {path}")
    if not search:
        if os.path.lexists(target):
            return EditResult(path, False, f"{path} already exists: give `search` text to change it")
        data = replace.encode("utf-8")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return EditResult(path, True, f"created {path}")
    data = read_regular(target, MAX_FILE_BYTES + 1)
    if data is None:
        return EditResult(path, False, f"{path}: no such file (an empty `search` creates one)")
    if len(data) > MAX_FILE_BYTES:  # only part of it was read: writing that back would cut the file
        return EditResult(path, False, f"{path} is over {MAX_FILE_BYTES} bytes: too large to edit")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return EditResult(path, False, f"{path} is not UTF-8 text")
    count = _occurrences(text, search)
    if count == 0:
        loose = _loose(search)  # empty for a search of only whitespace, which is "in" any text
        hint = " (it does appear with other indentation or spacing)" if loose and loose in _loose(text) else ""
        return EditResult(path, False, f"`search` text not found in {path}{hint}; copy it exactly from the file")
    if count > 1:
        return EditResult(path, False, f"`search` text occurs {count} times in {path}; include more lines so it is unique")
    target.write_bytes(text.replace(search, replace, 1).encode("utf-8"))  # encoded first: a failure writes nothing
    return EditResult(path, True, f"edited {path}")


def apply_edits(root: Path, edits: list[Mapping[str, Any]]) -> list[EditResult]:
    return [apply_edit(root, str(e.get("path", "")), str(e.get("search", "")), str(e.get("replace", ""))) for e in edits]


def _occurrences(text: str, search: str) -> int:
    """How many places ``search`` starts at in ``text``, overlapping ones too: ``str.count`` found
    two lines of ``pass`` once in three, and the edit took the first of its two places."""
    count, at = 0, text.find(search)
    while at != -1:
        count, at = count + 1, text.find(search, at + 1)
    return count


def _loose(text: str) -> str:
    return "\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip())
