"""One node, several worker processes: ``nsqx nsqd --workers=N``.

The supervisor is the node to the operating system: it locks the data directory,
checks its format, binds the TCP, HTTP and HTTPS listeners (one SO_REUSEPORT socket
per worker on each address, so that the kernel spreads connections over the workers),
writes the node's id, and starts N workers: each the same ``nsqx nsqd`` command line
run as worker i of N (nsqx.nsqd.workers.spec), hosting the partitions it owns. The
sockets stay open here, so a worker that dies is restarted on the same sockets with
the connections waiting in their backlog, and recovers its partitions from disk as
after a crash. SIGTERM or SIGINT stops every worker (each closes as a single nsqd
closes: cursors checkpointed, logs fsynced) before the supervisor lets go of the
directory. A worker dies with its supervisor (PR_SET_PDEATHSIG), so killing the node
kills all of it, as killing a single nsqd does.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import secrets
import signal
import socket
import sys
import time

from nsqx.nsqd.metadata import DataDirLock
from nsqx.nsqd.nsqd import NODE_ID_FILE
from nsqx.nsqd.options import NsqdOptions, split_address
from nsqx.nsqd.workers.spec import SPEC_ENV, WorkerSpec
from nsqx.store.data_format import DataFormatError, open_data_dir
from nsqx.store.durable_file import makedirs_durable, write_durable

log = logging.getLogger("nsqx.nsqd")

#: how long stopping workers have to close before they are killed
STOP_TIMEOUT = 30.0
#: a worker that dies sooner than this after its start is restarted after a pause
#: (doubling up to MAX_RESTART_DELAY), so that a worker that cannot start does not spin
QUICK_DEATH = 2.0
MAX_RESTART_DELAY = 10.0

_PR_SET_PDEATHSIG = 1


def bind_listeners(address: str, count: int) -> list[socket.socket]:
    """``count`` listening sockets on ``host:port`` sharing it with SO_REUSEPORT (port 0:
    the first one picks a free port for all), or one unix socket shared by all."""
    if "/" in address:
        try:
            os.unlink(address)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(address)
        sock.listen(1024)
        return [sock] * count
    host, port = split_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.listen(1024)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill this process when its parent dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return
    if os.getppid() != parent_pid:  # it died before the request took
        os._exit(1)


class Supervisor:
    """Starts, watches and stops the worker processes of one node."""

    def __init__(self, options: NsqdOptions, argv: list[str]) -> None:
        self.options = options
        self.argv = argv
        self.count = options.workers
        self.data_path = options.data_path or os.getcwd()
        self._lock = DataDirLock(self.data_path)
        self._sockets: dict[str, list[socket.socket]] = {}
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._started_at: dict[int, float] = {}
        self._delay: dict[int, float] = {}
        self._stopping = False
        self.prefix = f"nsqx-{os.getpid()}-{secrets.token_hex(4)}"
        #: what a request forwarded between workers carries (see workers.http_routes)
        self.token = secrets.token_hex(16)
        self.tcp_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self.internal_http_ports: list[int] = []

    def _bind(self) -> None:
        opts = self.options
        if opts.tcp_address:
            self._sockets["tcp"] = bind_listeners(opts.tcp_address, self.count)
            name = self._sockets["tcp"][0].getsockname()
            if isinstance(name, tuple):
                self.tcp_address = (name[0], name[1])
                log.info("TCP: listening on %s:%d (%d workers)", name[0], name[1], self.count)
        if opts.http_address:
            self._sockets["http"] = bind_listeners(opts.http_address, self.count)
            name = self._sockets["http"][0].getsockname()
            if isinstance(name, tuple):
                self.http_address = (name[0], name[1])
                log.info("HTTP: listening on %s:%d (%d workers)", name[0], name[1], self.count)
        if opts.https_address and opts.tls_cert and opts.tls_key:
            self._sockets["https"] = bind_listeners(opts.https_address, self.count)
        # each worker's own HTTP API on loopback, for the requests other workers forward
        internal = []
        for _ in range(self.count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            internal.append(sock)
            self._sockets.setdefault("internal_http", []).append(sock)
            sock.bind(("127.0.0.1", 0))
            sock.listen(1024)
        self.internal_http_ports = [s.getsockname()[1] for s in internal]

    def _write_node_id(self) -> None:
        """The node's id for nsqlookupd, chosen at the first start as a single nsqd
        chooses it (its workers read it)."""
        path = os.path.join(self.data_path, NODE_ID_FILE)
        if os.path.exists(path):
            return
        port = self.tcp_address[1] if self.tcp_address else 0
        write_durable(path, f"{self.options.broadcast_address}:{port}\n".encode())

    def start(self) -> None:
        """Lock and check the data directory, bind the listeners (raises if it cannot)."""
        makedirs_durable(self.data_path)
        self._lock.acquire()
        try:
            open_data_dir(self.data_path, "nsqx nsqd")
            self._bind()
            self._write_node_id()
        except (OSError, DataFormatError):
            self._close_sockets()
            self._lock.release()
            raise

    def _spec(self, index: int) -> tuple[WorkerSpec, list[int]]:
        fds = {k: socks[index].fileno() for k, socks in self._sockets.items()}
        spec = WorkerSpec(
            index,
            self.count,
            self.prefix,
            fds.get("tcp", -1),
            fds.get("http", -1),
            fds.get("https", -1),
            fds["internal_http"],
            self.internal_http_ports,
            self.token,
        )
        # the workers hold the directory's lock too (a shared open file): it is free
        # only once every process of the node is gone
        return spec, sorted({*fds.values(), self._lock.fileno()})

    async def _spawn(self, index: int) -> bool:
        """Start worker ``index``; True once it says it started (its listeners served,
        its partitions open), False if it exited first."""
        spec, fds = self._spec(index)
        ready_r, ready_w = os.pipe()
        spec.ready_fd = ready_w
        env = dict(os.environ)
        env[SPEC_ENV] = spec.to_json()
        env["NSQX_SUPERVISOR_PID"] = str(os.getpid())
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "nsqx",
                "nsqd",
                *self.argv,
                env=env,
                pass_fds=[*fds, ready_w],
            )
        finally:
            os.close(ready_w)
        self._procs[index] = proc
        self._started_at[index] = time.monotonic()
        log.info("WORKERS: worker %d started (pid %d)", index, proc.pid)
        loop = asyncio.get_running_loop()
        said = loop.create_future()

        def readable() -> None:
            loop.remove_reader(ready_r)
            if not said.done():
                said.set_result(os.read(ready_r, 1) == b"1")

        loop.add_reader(ready_r, readable)
        try:
            # (the pipe's end closes with the worker: an exit before it started reads b"")
            return bool(await said)
        finally:
            loop.remove_reader(ready_r)
            os.close(ready_r)

    async def _watch(self, index: int) -> None:
        """Restart worker ``index`` whenever it exits, until the node stops."""
        while not self._stopping:
            proc = self._procs[index]
            code = await proc.wait()
            if self._stopping:
                return
            lived = time.monotonic() - self._started_at[index]
            delay = 0.0
            if lived < QUICK_DEATH:
                delay = self._delay[index] = min(
                    max(self._delay.get(index, 0.5) * 2, 1.0), MAX_RESTART_DELAY
                )
            else:
                self._delay[index] = 0.5
            log.error(
                "WORKERS: worker %d (pid %d) exited with %s; restarting%s",
                index,
                proc.pid,
                code,
                f" in {delay:.1f}s" if delay else "",
            )
            if delay:
                await asyncio.sleep(delay)
            if self._stopping:
                return
            await self._spawn(index)

    async def run(self, stop: asyncio.Event) -> int:
        """Run the workers until ``stop`` is set, then stop them; 0 when all closed.
        A worker that cannot start the first time (a bad certificate, a damaged
        directory) stops the node with 1, as a single nsqd that cannot start."""
        started = await asyncio.gather(*(self._spawn(i) for i in range(self.count)))
        failed = [i for i, ok in enumerate(started) if not ok]
        watchers = []
        if failed:
            log.critical("failed to start: worker %d could not start (its log says why)", failed[0])
        else:
            log.info("WORKERS: %d workers started", self.count)
            watchers = [asyncio.create_task(self._watch(i)) for i in range(self.count)]
            await stop.wait()
        self._stopping = True
        for task in watchers:
            task.cancel()
        code = await self._stop_workers()
        if failed:
            code = 1
        self._close_sockets()
        self._lock.release()
        if self.options.tcp_address and "/" in self.options.tcp_address:
            try:
                os.unlink(self.options.tcp_address)
            except OSError:
                pass
        return code

    async def _stop_workers(self) -> int:
        procs = list(self._procs.values())
        for proc in procs:
            if proc.returncode is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        code = 0
        try:
            # (each worker drains first: --drain-timeout)
            async with asyncio.timeout(STOP_TIMEOUT + self.options.drain_timeout):
                for proc in procs:
                    if await proc.wait() not in (0, -signal.SIGTERM):
                        code = 1
        except TimeoutError:
            log.error(
                "WORKERS: workers did not stop within %.0fs; killing them",
                STOP_TIMEOUT + self.options.drain_timeout,
            )
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
            code = 1
        return code

    def _close_sockets(self) -> None:
        closed: set[int] = set()
        for socks in self._sockets.values():
            for sock in socks:
                if id(sock) not in closed:
                    closed.add(id(sock))
                    sock.close()
        self._sockets.clear()


def worker_spec_from_env() -> WorkerSpec | None:
    """This process's spec when it runs as a worker of a supervisor, else None."""
    text = os.environ.get(SPEC_ENV)
    if not text:
        return None
    spec = WorkerSpec.from_json(text)
    parent = os.environ.get("NSQX_SUPERVISOR_PID")
    if parent:
        die_with_parent(int(parent))
    # (its own children, if any, are not workers)
    del os.environ[SPEC_ENV]
    return spec
