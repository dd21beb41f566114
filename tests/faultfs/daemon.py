"""The faultfs daemon: mounts a :class:`~faultfs.fs.ForgetfulFS` over a backing
directory and takes commands on a unix socket, one JSON object a line each way.

    python tests/faultfs/daemon.py BACKING MOUNTPOINT --control SOCKET

Commands: ``{"op": "ping"}`` (``mounted``: whether the kernel's INIT came),
``{"op": "cut", "mode": "all"|"reorder"|"torn"|"torn-last", "seed": N, "p": 0.5}``,
``{"op": "flip", "path": "/x", "offset": N|null, "bit": N|null, "seed": N}``,
``{"op": "truncate", "path": "/x", "length": N}``, ``{"op": "stats"}``. Every answer is
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. It runs until the mount
is unmounted; a clean unmount keeps everything (what a clean shutdown writes back).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import sys
import threading
from typing import Any

# libfuse 3 when both are installed: the rename flags and the config below are its own
os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")

import mfusepy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from faultfs.fs import ForgetfulFS


class _Fuse(mfusepy.FUSE):  # type: ignore[misc]
    """mfusepy's FUSE, giving rename its flags and truncate its handle (libfuse 3)."""

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return int(self.operations.rename(old.decode(), new.decode(), flags) or 0)

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        fh = fip.contents.fh if fip else None
        return int(
            self.operations.truncate(None if path is None else path.decode(), length, fh) or 0
        )


def _handle(fs: ForgetfulFS, req: dict[str, Any]) -> dict[str, Any]:
    op = req.get("op")
    if op == "ping":
        return {"mounted": fs.mounted.is_set(), "dead": fs.dead}
    if op == "stats":
        with fs.mutex:
            pending = sum(len(n.ops) for n in fs.files.values())
            return {
                "counts": dict(fs.counts),
                "open_files": len(fs.files),
                "changed_dirs": len(fs.changed),
                "attic": len(fs.in_attic),
                "pending_file_ops": pending,
            }
    if op == "cut":
        return fs.cut(req.get("mode", "all"), req.get("seed"), float(req.get("p", 0.5)))
    if op == "flip":
        return fs.flip_bit(req["path"], req.get("offset"), req.get("bit"), req.get("seed"))
    if op == "truncate":
        return fs.cut_file(req["path"], int(req["length"]))
    raise ValueError(f"unknown op {op!r}")


def _serve(fs: ForgetfulFS, sock: socket.socket) -> None:
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=_client, args=(fs, conn), daemon=True).start()


def _client(fs: ForgetfulFS, conn: socket.socket) -> None:
    with conn, conn.makefile("rwb") as f:
        for line in f:
            try:
                answer = {"ok": True, **_handle(fs, json.loads(line))}
            except Exception as err:  # the caller gets every failure as an answer
                answer = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            f.write(json.dumps(answer).encode() + b"\n")
            f.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("backing")
    ap.add_argument("mountpoint")
    ap.add_argument("--control", required=True, help="the unix socket to listen on")
    ap.add_argument("--debug", action="store_true")
    args = ap.parse_args(argv)
    fs = ForgetfulFS(args.backing)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.control)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(args.control)
    sock.listen(8)
    threading.Thread(target=_serve, args=(fs, sock), daemon=True).start()
    _Fuse(
        fs,
        args.mountpoint,
        foreground=True,
        # one thread: the operations are short (no real fsync: the backing directory
        # is "the disk", and it survives), and the model needs no finer locking
        nothreads=True,
        debug=args.debug,
        # unlinked files stay open through their handles (no .fuse_hidden renames)
        hard_remove=True,
        # the nodes run in other mount namespaces (ip netns exec), as root
        allow_other=True,
        fsname="faultfs",
        subtype="faultfs",
    )
    if not fs.dead:
        # a clean unmount: what the page cache held is written back; nothing to undo
        with fs.mutex:
            for fd in list(fs.files):
                with contextlib.suppress(OSError):
                    os.close(fd)
            shutil.rmtree(fs.attic, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
