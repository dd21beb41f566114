"""Network fault injection for tests: a lab of network namespaces on one bridge.

A :class:`Lab` builds a *hub* namespace holding a Linux bridge (and an address of its own
on it, where the harness and clients run) and any number of *hosts*, each a namespace
joined to the bridge by a veth pair. Faults are iptables rules inside the hosts'
namespaces, all in a dedicated chain (``NSQXC``, jumped to from INPUT and OUTPUT), tagged
with a comment per fault, so :meth:`Lab.heal` removes exactly the rules it added. Delay is
done in user space (this kernel has no netem): an ``NFQUEUE`` rule plus an
``nfqdelay.py`` process per rule that holds each packet, then accepts it.

Pairwise faults drop on the *receiving* side (INPUT of each host): a sender's packets
leave, as on a real network, and never fail locally with EPERM the way an OUTPUT drop
does. Nothing outside the lab's namespaces is touched (no root-namespace interface,
address, route or firewall rule) except :meth:`Lab.tmpfs`, a mount in this process's
mount namespace, removed on close.

Namespaces are named ``nsqxc<pid>-<lab>-<name>``; a new Lab deletes the leftovers of dead
pids (and kills what still runs in them). Needs root, ``ip`` (iproute2) and iptables
(``iptables-restore``); :meth:`Lab.unavailable` says why a lab cannot run here.

Typical use::

    with Lab() as lab:
        n1, n2 = lab.add_host("n1"), lab.add_host("n2")
        lab.popen(n1, ["nsqd", "--tcp-address", f"{n1.ip}:4150"])
        lab.cut(n1, n2)
        ...
        lab.heal()
        print(lab.timeline())
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import functools
import ipaddress
import itertools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CHAIN", "PREFIX", "Flap", "Host", "Lab", "enter_netns", "read_line"]

PREFIX = "nsqxc"
CHAIN = "NSQXC"
NETNS_DIR = Path("/run/netns")
NFQDELAY = Path(__file__).with_name("nfqdelay.py")
CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"^[A-Za-z0-9_.]{1,32}$")
_OURS = re.compile(rf"^{PREFIX}(\d+)-")
_labs = itertools.count()


@dataclass(frozen=True)
class Host:
    """One namespace of the lab: ``name`` as given, ``ns`` its namespace, ``ip`` its address."""

    name: str
    ns: str
    ip: str

    def __str__(self) -> str:
        return self.name


@dataclass
class _Fault:
    id: int
    kind: str
    a: Host
    b: Host | None
    desc: str
    # namespace -> [(position "I" top or "A" bottom, rule spec without chain)]
    rules: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    procs: list[tuple[Host, subprocess.Popen[bytes]]] = field(default_factory=list)

    @property
    def tag(self) -> str:
        return f"{PREFIX}-f{self.id}"

    def touches(self, a: Host | None, b: Host | None) -> bool:
        return _touches(self.a, self.b, a, b)


class _CmdError(RuntimeError):
    pass


class _Closed(RuntimeError):
    pass


def _touches(fa: Host, fb: Host | None, a: Host | None, b: Host | None) -> bool:
    """Whether a fault on (fa, fb) is selected by heal(a, b)."""
    if a is None:
        return True
    if b is None:
        return a in (fa, fb)
    return {a, b} == {fa, fb}


def _pair(a: Host, b: Host) -> None:
    if a == b:
        raise ValueError(f"a fault needs two hosts, got {a} twice")


def _cmd(argv: list[str], input: str | None = None, timeout: float = 30.0) -> str:
    """Run a command, return its stdout; _CmdError with its stderr when it fails."""
    try:
        r = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise _CmdError(f"{' '.join(argv)}: {e}") from e
    if r.returncode != 0:
        raise _CmdError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def _in_ns(ns: str, argv: list[str], input: str | None = None) -> str:
    return _cmd(["ip", "netns", "exec", ns, *argv], input)


# IPv6 off (no ND/MLD chatter on the lab's links), then the fault chain: INPUT and OUTPUT
# jump to it first. Runs inside the namespace.
_NS_SETUP = (
    "for f in all default; do echo 1 > /proc/sys/net/ipv6/conf/$f/disable_ipv6; done"
    " 2>/dev/null; exec iptables-restore -w -n"
)
_CHAIN_SETUP = f"*filter\n:{CHAIN} - [0:0]\n-I INPUT 1 -j {CHAIN}\n-I OUTPUT 1 -j {CHAIN}\nCOMMIT\n"


def _setup_ns(ns: str) -> None:
    _in_ns(ns, ["sh", "-c", _NS_SETUP], _CHAIN_SETUP)


def _namespaces() -> list[str]:
    out = _cmd(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_ns(ns: str) -> None:
    """Kill whatever still runs in ``ns``, then delete it."""
    with contextlib.suppress(_CmdError):
        for pid in _cmd(["ip", "netns", "pids", ns]).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(_CmdError):
        _cmd(["ip", "netns", "del", ns])


def sweep() -> list[str]:
    """Delete the namespaces of dead pids' labs (``nsqxc<pid>-...``); returns their names."""
    swept = []
    for ns in _namespaces():
        m = _OURS.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            _delete_ns(ns)
            swept.append(ns)
    return swept


def enter_netns(ns: str) -> None:
    """Move the calling thread into network namespace ``ns`` (a name under /run/netns).

    Only the calling thread moves; threads it starts afterwards inherit it. So call this
    before starting threads or an event loop (their sockets then live in ``ns``).
    """
    fd = os.open(NETNS_DIR / ns if "/" not in ns else ns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(fd)
    finally:
        os.close(fd)


def _setns(fd: int) -> None:
    if sys.version_info >= (3, 12):
        os.setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def read_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The next line of ``proc``'s stdout (a pipe), within ``timeout`` s, without buffering
    past it; TimeoutError if none came, EOFError if the process closed its stdout."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no line from pid {proc.pid} in {timeout} s (so far {buf!r})")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            ch = os.read(fd, 1)
            if not ch:
                raise EOFError(f"pid {proc.pid} closed its stdout (so far {buf!r})")
            buf += ch
    return buf


@functools.cache
def _probe() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables", "iptables-restore", "mount", "umount", "sh"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install iproute2 iptables)"
    ns = f"{PREFIX}{os.getpid()}-probe"
    try:
        _cmd(["ip", "netns", "add", ns])
    except _CmdError as e:
        return f"cannot create a network namespace: {e}"
    try:
        _setup_ns(ns)
        _cmd(["ip", "-n", ns, "link", "add", "br0", "type", "bridge"])
        _cmd(["ip", "-n", ns, "link", "add", "va", "type", "veth", "peer", "name", "vb"])
    except _CmdError as e:
        return f"network namespace setup fails: {e}"
    finally:
        _delete_ns(ns)
    return None


def _root_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The IPv4 networks of this (root) namespace's addresses and routes (read only)."""
    nets = []
    with contextlib.suppress(_CmdError):
        for line in _cmd(["ip", "-4", "-o", "addr", "show"]).splitlines():
            parts = line.split()
            if "inet" in parts:
                nets.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
        for line in _cmd(["ip", "-4", "route", "show", "table", "all"]).splitlines():
            first = line.split()[0] if line.split() else ""
            if first in ("local", "broadcast", "unicast"):
                first = line.split()[1]
            if first and first != "default" and first[0].isdigit():
                with contextlib.suppress(ValueError):
                    nets.append(ipaddress.ip_network(first, strict=False))
    return nets


def _pick_subnet() -> str:
    used = _root_networks()
    for third in range(231, 255):
        net = ipaddress.ip_network(f"10.{third}.0.0/24")
        if not any(net.overlaps(u) for u in used):
            return str(net)
    return "10.231.0.0/24"


class Flap(threading.Thread):
    """A cut between two hosts toggled every ``period`` s for ``duration`` s; healed at the
    end (or on :meth:`stop`, or when the lab closes)."""

    def __init__(self, lab: Lab, a: Host, b: Host, period: float, duration: float) -> None:
        super().__init__(name=f"flap {a}<->{b}", daemon=True)
        self.lab, self.a, self.b = lab, a, b
        self.period, self.duration = period, duration
        self.cuts = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        end = time.monotonic() + self.duration
        fault: _Fault | None = None
        try:
            while not self._stop_event.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    break
                if fault is None:
                    try:
                        fault = self.lab._cut(self.a, self.b, "flap cut")
                    except _Closed:
                        break
                    self.cuts += 1
                else:
                    self.lab._remove(fault)
                    fault = None
                self._stop_event.wait(min(self.period, left))
        finally:
            if fault is not None:
                self.lab._remove(fault)
            self.lab._event(f"flap {self.a}<->{self.b} ended after {self.cuts} cuts")

    def stop(self) -> None:
        self._stop_event.set()
        if threading.current_thread() is not self:
            self.join()


class Lab:
    """Network namespaces on one bridge, with faults between them (a context manager)."""

    @staticmethod
    def unavailable() -> str | None:
        """Why a lab cannot run here (not root, no ip/iptables, namespaces fail), or None."""
        return _probe()

    def __init__(self, subnet: str | None = None) -> None:
        """Build the hub; ``subnet`` (an IPv4 network) defaults to the first free
        ``10.231-254.0.0/24`` not used by this machine's addresses or routes."""
        why = self.unavailable()
        if why:
            raise RuntimeError(f"network lab unavailable: {why}")
        self.net = ipaddress.ip_network(subnet or _pick_subnet())
        if not isinstance(self.net, ipaddress.IPv4Network):
            raise ValueError("the lab is IPv4 only")
        self.prefix = f"{PREFIX}{os.getpid()}-{next(_labs)}-"
        self.events: list[tuple[float, str]] = []
        self.started = time.time()
        self.hosts: list[Host] = []
        self._addresses = self.net.hosts()
        self._lock = threading.RLock()
        self._faults: list[_Fault] = []
        self._fault_ids = itertools.count(1)
        self._queues = itertools.count(100)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._flaps: list[Flap] = []
        self._mounts: list[str] = []
        self._namespaces: list[str] = []
        self._home: dict[int, int] = {}  # thread id -> fd of its namespace before enter()
        self._closed = False
        atexit.register(self.close)
        try:
            swept = sweep()
            if swept:
                self._event(f"swept leftovers of dead pids: {' '.join(swept)}")
            self.hub = self._make_ns("hub")
            _cmd(["ip", "-n", self.hub.ns, "link", "add", "br0", "type", "bridge"])
            self._batch(
                self.hub.ns,
                f"addr add {self.hub.ip}/{self.net.prefixlen} dev br0",
                "link set br0 up",
                "link set lo up",
            )
            self._event(f"lab {self.prefix}* on {self.net}, hub {self.hub.ip}")
        except BaseException:
            self.close()
            raise

    # -- topology ---------------------------------------------------------------------

    def _make_ns(self, name: str) -> Host:
        if not _NAME.match(name):
            raise ValueError(f"host name {name!r}: letters, digits, _ and . only")
        with self._lock:
            if any(h.name == name for h in self.hosts):
                raise ValueError(f"host {name!r} exists")
            try:
                ip = str(next(self._addresses))
            except StopIteration:
                raise ValueError(f"subnet {self.net} is full") from None
            host = Host(name, self.prefix + name, ip)
            _cmd(["ip", "netns", "add", host.ns])
            self._namespaces.append(host.ns)
            self.hosts.append(host)
        _setup_ns(host.ns)
        return host

    def _batch(self, ns: str, *commands: str) -> None:
        _cmd(["ip", "-n", ns, "-batch", "-"], "\n".join(commands) + "\n")

    def add_host(self, name: str) -> Host:
        """A new namespace joined to the hub's bridge (veth ``eth0``), next address, lo up."""
        host = self._make_ns(name)
        port = f"vh{self.hosts.index(host)}"
        self._batch(
            self.hub.ns,
            f"link add {port} type veth peer name eth0 netns {host.ns}",
            f"link set {port} master br0 up",
        )
        self._batch(
            host.ns,
            f"addr add {host.ip}/{self.net.prefixlen} dev eth0",
            "link set eth0 up",
            "link set lo up",
        )
        self._event(f"host {name} {host.ip}")
        return host

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    # -- processes ----------------------------------------------------------------------

    def popen(self, host: Host, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` in ``host``'s namespace (``ip netns exec``), in a session of its
        own unless ``start_new_session=False``; killed on close (SIGTERM, then SIGKILL)."""
        kw.setdefault("start_new_session", True)
        proc: subprocess.Popen[bytes] = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, *argv], **kw
        )
        with self._lock:
            self._procs.append(proc)
        return proc

    def run(
        self, host: Host, argv: list[str], timeout: float = 60.0, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in ``host``'s namespace to its end; text stdout/stderr captured."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(
            ["ip", "netns", "exec", host.ns, *argv], timeout=timeout, check=False, **kw
        )

    def stop(self, proc: subprocess.Popen[Any], grace: float = 3.0) -> int:
        """SIGTERM ``proc`` (its session, when it has one), SIGKILL after ``grace`` s."""
        _terminate([proc], grace)
        with self._lock:
            if proc in self._procs:
                self._procs.remove(proc)
        return proc.returncode

    def enter(self, host: Host) -> None:
        """Move the calling thread's network namespace into ``host``'s (see enter_netns);
        :meth:`leave` (or close) moves it back."""
        tid = threading.get_ident()
        if tid not in self._home:
            self._home[tid] = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        enter_netns(host.ns)

    def leave(self) -> None:
        """Move the calling thread back to the namespace it had before its first enter()."""
        fd = self._home.pop(threading.get_ident(), None)
        if fd is not None:
            try:
                _setns(fd)
            finally:
                os.close(fd)

    # -- faults ---------------------------------------------------------------------------

    def _event(self, what: str) -> None:
        with self._lock:
            self.events.append((time.time(), what))

    def timeline(self) -> str:
        """The events, one a line: seconds since the lab started, then what happened."""
        with self._lock:
            return "\n".join(f"{t - self.started:9.3f}s  {what}" for t, what in self.events)

    def _add(self, fault: _Fault) -> _Fault:
        with self._lock:
            if self._closed:
                raise _Closed("lab is closed")
            self._faults.append(fault)
            try:
                for ns, rules in fault.rules.items():
                    lines = [
                        f"-{pos} {CHAIN}{' 1' if pos == 'I' else ''} "
                        f"-m comment --comment {fault.tag} {spec}"
                        for pos, spec in rules
                    ]
                    _in_ns(ns, ["iptables-restore", "-w", "-n"], _restore(lines))
            except BaseException:
                # a rule refused (a bad spec): take back what went in, by its tag
                with contextlib.suppress(Exception):
                    self._remove(fault, quiet=True)
                raise
            self._event(fault.desc)
            return fault

    def _remove(self, fault: _Fault, quiet: bool = False) -> None:
        with self._lock:
            if fault not in self._faults:
                return
            self._faults.remove(fault)
            for ns in fault.rules:
                listing = _in_ns(ns, ["iptables", "-w", "-S", CHAIN])
                lines = [
                    "-D" + line[2:]
                    for line in listing.splitlines()
                    if line.startswith("-A ")
                    and re.search(rf"--comment \"?{fault.tag}\"?( |$)", line)
                ]
                if lines:
                    _in_ns(ns, ["iptables-restore", "-w", "-n"], _restore(lines))
            stats = [f"{h}: {_stop_delayer(p)}" for h, p in fault.procs]
            extra = f" ({'; '.join(stats)})" if stats else ""
            if not quiet:
                self._event(f"heal {fault.desc}{extra}")

    def _new(self, kind: str, a: Host, b: Host | None, desc: str) -> _Fault:
        return _Fault(next(self._fault_ids), kind, a, b, desc)

    def _cut(self, a: Host, b: Host, desc: str = "cut") -> _Fault:
        _pair(a, b)
        f = self._new("cut", a, b, f"{desc} {a}<->{b}")
        f.rules = {a.ns: [("I", f"-s {b.ip}/32 -j DROP")], b.ns: [("I", f"-s {a.ip}/32 -j DROP")]}
        return self._add(f)

    def cut(self, a: Host, b: Host) -> None:
        """No packet between ``a`` and ``b``, either way (dropped: connects time out)."""
        self._cut(a, b)

    def cut_oneway(self, src: Host, dst: Host) -> None:
        """Packets from ``src`` to ``dst`` dropped (at ``dst``); ``dst`` -> ``src`` flow.
        TCP needs both ways, so a TCP connection between them stalls either way."""
        _pair(src, dst)
        f = self._new("cut_oneway", src, dst, f"cut_oneway {src}->{dst}")
        f.rules = {dst.ns: [("I", f"-s {src.ip}/32 -j DROP")]}
        self._add(f)

    def block_connect(self, src: Host, dst: Host, refuse: bool = False) -> None:
        """New TCP connections from ``src`` to ``dst`` fail (their SYNs dropped, so connect
        times out; ``refuse=True``: answered with a RST, so connect is refused at once).
        Established connections and ``dst`` -> ``src`` connections live."""
        _pair(src, dst)
        action = "REJECT --reject-with tcp-reset" if refuse else "DROP"
        f = self._new("block_connect", src, dst, f"block_connect {src}->{dst} ({action})")
        f.rules = {dst.ns: [("I", f"-s {src.ip}/32 -p tcp --syn -j {action}")]}
        self._add(f)

    def isolate(self, a: Host) -> None:
        """``a`` cut from every other host now in the lab, the hub included (hosts added
        later are not cut; loopback still works)."""
        f = self._new("isolate", a, None, f"isolate {a}")
        others = [h for h in self.hosts if h != a]
        f.rules = {a.ns: [("I", f"-s {h.ip}/32 -j DROP") for h in others]}
        for h in others:
            f.rules[h.ns] = [("I", f"-s {a.ip}/32 -j DROP")]
        self._add(f)

    def loss(self, a: Host, b: Host, percent: float) -> None:
        """Each packet between ``a`` and ``b`` (either way) dropped with ``percent`` %."""
        _pair(a, b)
        if not 0 <= percent <= 100:
            raise ValueError("percent is 0..100")
        match = (
            ""
            if percent >= 100
            else f"-m statistic --mode random --probability {percent / 100:.6f} "
        )
        f = self._new("loss", a, b, f"loss {a}<->{b} {percent:g}%")
        f.rules = {
            a.ns: [("I", f"-s {b.ip}/32 {match}-j DROP")],
            b.ns: [("I", f"-s {a.ip}/32 {match}-j DROP")],
        }
        self._add(f)

    def delay(self, a: Host, b: Host, ms: float, jitter_ms: float = 0, loss: float = 0) -> None:
        """Every packet between ``a`` and ``b`` held ``ms`` (+- ``jitter_ms``, uniform; jitter
        reorders) on arrival, each way, so a round trip takes 2 x ``ms`` more; ``loss``
        % of them dropped by the delayer. Replaces an earlier delay between the two."""
        _pair(a, b)
        if ms < 0 or jitter_ms < 0:
            raise ValueError("ms and jitter_ms are >= 0")
        with self._lock:
            for old in [f for f in self._faults if f.kind == "delay" and f.touches(a, b)]:
                self._remove(old)
            f = self._new("delay", a, b, f"delay {a}<->{b} {ms:g}ms +-{jitter_ms:g}ms")
            if loss:
                f.desc += f" loss {loss:g}%"
            try:
                for here, there in ((a, b), (b, a)):
                    queue = next(self._queues)
                    argv = [
                        sys.executable,
                        str(NFQDELAY),
                        f"--queue={queue}",
                        f"--delay-ms={ms}",
                        f"--jitter-ms={jitter_ms}",
                        f"--loss={loss}",
                    ]
                    proc: subprocess.Popen[bytes] = subprocess.Popen(
                        ["ip", "netns", "exec", here.ns, *argv],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        start_new_session=True,
                    )
                    f.procs.append((here, proc))
                    try:
                        line = read_line(proc, 10.0)
                    except (TimeoutError, EOFError) as e:
                        _terminate([proc], 1.0)
                        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                        raise RuntimeError(f"nfqdelay in {here}: {e} {err.strip()}") from None
                    if line.strip() != b"ready":
                        raise RuntimeError(f"nfqdelay in {here}: {line!r}")
                    f.rules[here.ns] = [
                        ("A", f"-s {there.ip}/32 -j NFQUEUE --queue-num {queue} --queue-bypass")
                    ]
                self._add(f)
            except BaseException:
                for _h, p in f.procs:
                    _stop_delayer(p)
                raise

    def rule(self, host: Host, spec: str, desc: str | None = None) -> None:
        """A custom rule in ``host``'s fault chain (seen on INPUT and OUTPUT), e.g.
        ``"-p tcp --dport 4151 -j REJECT"``; put first in the chain, undone by heal
        (``heal(host)`` or ``heal()``)."""
        f = self._new("rule", host, None, desc or f"rule {host}: {spec}")
        f.rules = {host.ns: [("I", spec)]}
        self._add(f)

    def heal(self, a: Host | None = None, b: Host | None = None) -> None:
        """Undo faults: all of them; those touching ``a``; or those between ``a`` and ``b``
        (a flap between them stops too)."""
        with self._lock:
            flaps = [f for f in self._flaps if f.is_alive() and _touches(f.a, f.b, a, b)]
        for fl in flaps:
            fl.stop()
        with self._lock:
            for f in [f for f in self._faults if f.touches(a, b)]:
                self._remove(f)

    def faults(self) -> list[str]:
        """The faults in force, as their descriptions."""
        with self._lock:
            return [f.desc for f in self._faults]

    def rules(self, host: Host) -> list[str]:
        """The rules now in ``host``'s fault chain (``iptables -S`` lines)."""
        listing = _in_ns(host.ns, ["iptables", "-w", "-S", CHAIN])
        return [line for line in listing.splitlines() if line.startswith("-A ")]

    def flap(self, a: Host, b: Host, period: float, duration: float) -> Flap:
        """Cut ``a``-``b``, heal, cut... every ``period`` s for ``duration`` s, in a thread
        (returned started; ``.stop()`` ends it early); healed at the end."""
        fl = Flap(self, a, b, period, duration)
        with self._lock:
            self._flaps.append(fl)
        self._event(f"flap {a}<->{b} every {period:g}s for {duration:g}s")
        fl.start()
        return fl

    def tmpfs(self, path: str | os.PathLike[str], size_mb: int) -> None:
        """Mount a ``size_mb`` MiB tmpfs at ``path`` (made if missing; unmounted on close):
        writes past it fail with ENOSPC. Processes started afterwards in any host see it."""
        p = os.fspath(path)
        os.makedirs(p, exist_ok=True)
        _cmd(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=1777", "nsqxc-tmpfs", p])
        with self._lock:
            self._mounts.append(p)
        self._event(f"tmpfs {p} {size_mb}MiB")

    def fill(self, path: str | os.PathLike[str]) -> int:
        """Fill the filesystem of directory ``path`` (a :meth:`tmpfs`) with a file
        ``.nsqxc-fill`` until ENOSPC, so the next write there fails: a disk filling up
        while processes run. Returns the bytes written; :meth:`unfill` frees them."""
        filler = Path(path) / ".nsqxc-fill"
        written = 0
        chunk = b"\0" * (1 << 16)
        with open(filler, "ab", buffering=0) as f:
            while True:
                try:
                    n = f.write(chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        break
                    chunk = chunk[: len(chunk) // 2]  # top up the last partial block
                    continue
                written += n or 0
        self._event(f"fill {path}: {written} bytes, now full")
        return written

    def unfill(self, path: str | os.PathLike[str]) -> None:
        """Remove the file :meth:`fill` wrote in ``path``."""
        with contextlib.suppress(FileNotFoundError):
            (Path(path) / ".nsqxc-fill").unlink()
        self._event(f"unfill {path}")

    # -- teardown -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop flaps and delayers, kill tracked processes, unmount, delete the namespaces.
        Idempotent; never raises for a part already gone."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            flaps, self._flaps = self._flaps, []
        for fl in flaps:
            with contextlib.suppress(Exception):
                fl.stop()
        with self._lock:
            faults, self._faults = self._faults, []
            procs, self._procs = self._procs, []
            mounts, self._mounts = self._mounts, []
        for f in faults:
            for _h, p in f.procs:
                with contextlib.suppress(Exception):
                    _stop_delayer(p)
        _terminate(procs, 3.0)
        for m in reversed(mounts):
            try:
                _cmd(["umount", m])
            except _CmdError:
                with contextlib.suppress(_CmdError):
                    _cmd(["umount", "-l", m])
        self.leave()
        for ns in reversed(self._namespaces):
            _delete_ns(ns)
        for fd in self._home.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._home.clear()
        self._event("closed")
        atexit.unregister(self.close)

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _restore(lines: list[str]) -> str:
    return "*filter\n" + "\n".join(lines) + "\nCOMMIT\n"


def _signal(proc: subprocess.Popen[Any], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        try:
            # our popen puts each in a session of its own: signal what it started too
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, sig)
                return
        except ProcessLookupError:
            return
        proc.send_signal(sig)


def _terminate(procs: list[subprocess.Popen[Any]], grace: float) -> None:
    """SIGTERM each, wait up to ``grace`` s for all, SIGKILL the rest."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.poll() is None:
            _signal(p, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5.0)


def _stop_delayer(proc: subprocess.Popen[bytes]) -> str:
    """Stop an nfqdelay (it accepts what it holds first); its ``stats`` line or ''."""
    _terminate([proc], 3.0)
    out = b""
    if proc.stdout is not None:
        with contextlib.suppress(OSError, ValueError):
            out = proc.stdout.read()
            proc.stdout.close()
    if proc.stderr is not None:
        with contextlib.suppress(OSError, ValueError):
            proc.stderr.close()
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("stats "):
            return line[len("stats ") :]
    return ""
