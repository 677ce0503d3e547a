"""util-linux unshare backend: new namespaces, then a small sh script (the namespace's
init) builds a new root at a staging directory (a tmpfs holding read-only binds of the system
folders) and chroots into it."""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from .base import TMP, Backend, Layout, tool
from .confine import CHAIN_TOOLS, missing_tools

# An empty host directory; the mounts on it exist only inside each run's own mount
# namespace, so concurrent runs share it safely.
STAGING_DIR = Path("/run/rolecast-sandbox/root")


class UnshareBackend(Backend):
    name = "unshare"
    signal_as_exit_code = True

    def available(self) -> str | None:
        missing = missing_tools(("unshare", "mount", "chroot", *CHAIN_TOOLS))
        if missing:
            return missing
        if os.geteuid() != 0:
            return "needs root (to mount and to switch the child to a dedicated uid)"
        return None

    def wrap(self, inner: list[str], layout: Layout) -> list[str]:
        return [
            # unshare's own parent-death signal: it has no --die-with-parent.
            str(tool("setpriv")), "--pdeathsig=KILL", "--",
            str(tool("unshare")), "--mount", "--net", "--pid", "--ipc", "--uts", "--fork",
            "--kill-child=KILL", "--propagation=private", "--",
            "/bin/sh", "-c", self.script(layout), "sandbox-setup", *inner,
        ]

    @staticmethod
    def script(layout: Layout) -> str:
        mount, q = str(tool("mount")), shlex.quote
        r = q(str(STAGING_DIR))
        lines = [
            "set -e",
            "umask 022",
            f"mkdir -p {r}",
            # the new root: an empty tmpfs holding only what is put there
            f"{mount} -t tmpfs -o size=1m,mode=755,nosuid,nodev tmpfs {r}",
        ]
        for path in layout.system:
            dest = f"{r}{q(str(path))}"
            lines += [f"mkdir -p {r}{q(str(d))}" for d in layout.dirs_to_create(path)]
            if path.is_symlink():
                lines.append(f"ln -s {q(os.readlink(path))} {dest}")
            else:
                lines += [f"mkdir {dest}", f"{mount} --bind {q(str(path))} {dest}",
                          f"{mount} -o remount,bind,ro,nosuid,nodev {dest}"]
        lines += [
            f"mkdir {r}/proc {r}/dev {r}{TMP}",
            f"{mount} -t proc -o nosuid,nodev,noexec proc {r}/proc",
            # Host /dev: the child's uid can open only the world-rw nodes (null, zero,
            # random, tty...); /dev/shm is shared memory with the host, so replace it.
            f"{mount} --rbind /dev {r}/dev",
            f"{mount} -t tmpfs -o size=1m,mode=1777,nosuid,nodev tmpfs {r}/dev/shm",
            f"{mount} -t tmpfs -o size={layout.tmp_size_bytes},mode=1777,nosuid,nodev tmpfs {r}{TMP}",
        ]
        for path, kind in layout.mounts():
            dest = f"{r}{q(str(path))}"
            if kind == "hide":
                lines.append(f"{mount} -t tmpfs -o size=1m,mode=755,nosuid,nodev tmpfs {dest}")
                continue
            # a file binds onto a file: mkdir made a directory there, and mount failed (exit 32)
            make = [f"mkdir -p {dest}"] if path.is_dir() else [f"mkdir -p {r}{q(str(path.parent))}", f": > {dest}"]
            lines += [*make, f"{mount} -o {'bind,ro' if kind == 'read' else 'bind'} {q(str(path))} {dest}"]
        lines.append(f"{mount} -o remount,ro,nosuid,nodev {r}")
        # No exec: sh stays the namespace's init (root, so the child cannot signal it;
        # its parent-death signal intact), and reports a signal death as 128+N.
        lines += ["set +e", f'{tool("chroot")} {r} "$@"']
        return "\n".join(lines)
