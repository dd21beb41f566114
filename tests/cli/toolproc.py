"""Running ``nsqx <tool>`` as operators do: a real process, its stdout and stderr."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field

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

    def stop(self, timeout: float = 20) -> int:
        """SIGINT (Ctrl-C), then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(2)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def start(*args: str) -> Running:
    """Start ``nsqx <args>`` with stdin closed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsqx", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    running = Running(proc)

    def pump(stream: object, sink: list[bytes]) -> None:
        for line in iter(stream.readline, b""):  # type: ignore[attr-defined]
            sink.append(line)

    threading.Thread(target=pump, args=(proc.stdout, running.out), daemon=True).start()
    threading.Thread(target=pump, args=(proc.stderr, running.err), daemon=True).start()
    return running
