"""Running ``nsqx <tool>`` as operators do: a real process, its stdout and stderr."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV = dict(os.environ, PYTHONUNBUFFERED="1")


def nsqx(
    *args: str, stdin: bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    """Run ``nsqx <args>`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "nsqx", *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
        env=ENV,
    )


@dataclass
class Running:
    """A tool running in the background, its output collected by threads."""

    proc: subprocess.Popen[bytes]
    out: list[bytes] = field(default_factory=list)
    err: list[bytes] = field(default_factory=list)

    @property
    def stdout(self) -> bytes:
        return b"".join(self.out)

    @property
    def stderr(self) -> str:
        return b"".join(self.err).decode(errors="replace")

    def stop(self, timeout: float = 20, sig: int = signal.SIGINT) -> int:
        """SIGINT (Ctrl-C) or ``sig``, then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def start(
    *args: str,
    stdout: Path | None = None,
    stdin: int = subprocess.DEVNULL,
    env: dict[str, str] | None = None,
) -> Running:
    """Start ``nsqx <args>``: stdin closed (or ``subprocess.PIPE``: the caller writes
    to ``proc.stdin``), stdout collected (or written to the file ``stdout``, as
    ``nsqx tail > file`` does); ``env``: its environment (default: this one's)."""
    with contextlib.ExitStack() as stack:
        out: Any = subprocess.PIPE
        if stdout is not None:
            out = stack.enter_context(stdout.open("wb"))
        proc = subprocess.Popen(
            [sys.executable, "-m", "nsqx", *args],
            stdin=stdin,
            stdout=out,
            stderr=subprocess.PIPE,
            env=env or ENV,
        )
    running = Running(proc)

    def pump(stream: object, sink: list[bytes]) -> None:
        for line in iter(stream.readline, b""):  # type: ignore[attr-defined]
            sink.append(line)

    if proc.stdout is not None:
        threading.Thread(target=pump, args=(proc.stdout, running.out), daemon=True).start()
    threading.Thread(target=pump, args=(proc.stderr, running.err), daemon=True).start()
    return running
