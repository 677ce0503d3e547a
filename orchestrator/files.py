"""Files a run leaves behind, written so that a process killed at any point leaves each whole:
atomic replacement, durable directories, and a clear error for a file damaged since."""
from __future__ import annotations

import contextlib
import errno
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml

T = TypeVar("T")
# libyaml's loader and emitter where PyYAML has them (same documents): a run's config.yaml holds
# every task, and 100k short tasks took 7.3 s to write and 15.6 s to read in pure Python on a
# loaded 2-core machine, 2.6 s and 5.9 s in C
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# the disk saying no: full, over quota, remounted read-only, past the file size limit (cli.main
# says which file in one line)
DISK_FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """An OSError of the block that names no file (a write's or a flush's: a full disk) names ``path``."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def write_atomic(path: Path, text: str | bytes) -> None:
    """``path`` holds ``text`` or what it held before, whenever the process dies."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with writing(path), open(tmp, "wb") if isinstance(text, bytes) else open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk's half copy: it would hold the room the user makes for a retry
        tmp.unlink(missing_ok=True)
        raise


def append_line(fh: io.FileIO, line: bytes) -> None:
    """``line`` at the end of ``fh`` (opened unbuffered) whole or not at all: where the disk takes
    part of it (full), the file is cut back to where the line began, so that a reader of its JSON
    lines meets no half one, and the OSError names the file."""
    start = fh.tell()
    with writing(Path(fh.name)):
        try:
            view = memoryview(line)
            while view:
                view = view[fh.write(view):]
        except OSError:
            fh.truncate(start)
            fh.seek(start)
            raise


def save_torch(obj: Any, path: Path) -> None:
    """``torch.save`` through a Python file: a full disk is an OSError naming ``path``, where
    torch's own writer raised RuntimeError('unexpected pos')."""
    import torch

    with writing(path), open(path, "wb") as fh:
        torch.save(obj, fh)


def write_yaml(path: Path, data: Any) -> None:
    """``data`` as YAML in ``path``, atomically, keys in their order and text as written."""
    write_atomic(path, yaml.dump(data, Dumper=SAFE_DUMPER, sort_keys=False, allow_unicode=True))


def read_yaml(path: Path) -> Any:
    """A file this module wrote (a run's record: a user's own YAML goes through ``yamlfile``)."""
    return yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)


def fsync_dir(path: Path) -> None:
    """The files directly in ``path``, and its entries, on disk: a dir renamed into place after a
    crash holds whole files, and the rename itself survives."""
    for f in path.iterdir():
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_saved(path: Path, read: Callable[[Path], T]) -> T:
    """``read(path)``, where a file cut short or overwritten since it was saved (pickle's,
    safetensors', JSON's or torch's zip reader's error) is a ValueError naming it."""
    try:
        return read(path)
    except OSError:
        raise
    except Exception as exc:
        raise ValueError(f"{path} is damaged ({type(exc).__name__}: {exc})") from None
