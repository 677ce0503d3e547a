"""bubblewrap backend: bwrap (run by root, so no user namespace) builds the new root."""
from __future__ import annotations

import os
from pathlib import Path

from .base import TMP, Backend, Layout, tool
from .confine import CHAIN_TOOLS, missing_tools


class BwrapBackend(Backend):
    name = "bwrap"
    signal_as_exit_code = True

    def available(self) -> str | None:
        if tool("bwrap") is None:
            return "bwrap is not installed (apt-get install bubblewrap)"
        if os.geteuid() != 0:
            return "needs root (to switch the child to a dedicated uid)"
        return missing_tools(CHAIN_TOOLS)

    def wrap(self, inner: list[str], layout: Layout) -> list[str]:
        argv = [
            str(tool("bwrap")),
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",  # no TIOCSTI into a terminal it might inherit
            # Root keeps every capability in bwrap unless told; the chain only needs
            # these three to switch uid and empty its bounding set, then loses them.
            "--cap-drop", "ALL",
            "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP",
        ]
        # bwrap's root starts as an empty tmpfs: only what is put there exists
        for path in layout.system:
            argv += _parents(layout, path)
            argv += ["--symlink", os.readlink(path), str(path)] if path.is_symlink() else ["--ro-bind", str(path), str(path)]
        argv += [
            "--dev", "/dev",
            # bwrap's /dev/shm is a root-owned 0755 dir: sem_open (multiprocessing's locks) failed
            "--perms", "1777", "--size", str(1 << 20), "--tmpfs", "/dev/shm",
            "--proc", "/proc",
            "--perms", "1777", "--size", str(layout.tmp_size_bytes), "--tmpfs", str(TMP),
        ]
        for path, kind in layout.mounts():
            argv += _parents(layout, path)
            argv += (["--perms", "0755", "--tmpfs", str(path)] if kind == "hide"
                     else ["--ro-bind" if kind == "read" else "--bind", str(path), str(path)])
        return argv + ["--remount-ro", "/", "--"] + inner


def _parents(layout: Layout, path: Path) -> list[str]:
    """The folders on the way to ``path`` that are missing inside, made 0755: bwrap would make
    them 0700, unreachable for the child's uid."""
    return [arg for parent in layout.dirs_to_create(path) for arg in ("--perms", "0755", "--dir", str(parent))]
