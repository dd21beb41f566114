"""The network fault lab (chaos.netns) against real namespaces, sockets and iptables.

Servers run as processes in the hosts; clients run as processes in the hub (or a host):
this pytest process never changes its own network namespace. Failures are asserted with
short connect timeouts, recoveries by waiting on the condition; no upper bound on time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.netns import PREFIX, Host, Lab, read_line

REASON = Lab.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no network lab: {REASON}")

PORT = 7000
TESTS = str(Path(__file__).resolve().parents[1])

# TCP echo server (a first message "COUNT" answers "datagrams markers": how many UDP "d"
# and "m" datagrams came so far) plus that UDP counter, on argv[1]:argv[2]
SERVER = r"""
import socket, sys, threading
ip, port = sys.argv[1], int(sys.argv[2])
count = markers = 0
lock = threading.Lock()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE: no overflow on a burst
except OSError:
    pass
u.bind((ip, port))
def udp():
    global count, markers
    while True:
        d = u.recv(2048)
        with lock:
            if d == b"m":
                markers += 1
            else:
                count += 1
threading.Thread(target=udp, daemon=True).start()
srv = socket.create_server((ip, port))
def serve(c):
    with c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = c.recv(65536)
        if data.startswith(b"COUNT"):
            with lock:
                c.sendall(b"%d %d\n" % (count, markers))
            return
        while data:
            c.sendall(data)
            data = c.recv(65536)
print("ready", flush=True)
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# client commands, each printing one line: see the branches
CLIENT = r"""
import socket, sys, time
cmd, ip, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
args = sys.argv[4:]
def connect(timeout):
    try:
        s = socket.create_connection((ip, port), timeout=timeout)
    except socket.timeout:
        return "timeout", None
    except ConnectionRefusedError:
        return "refused", None
    except OSError as e:
        return "error %s" % e.errno, None
    return "ok", s
if cmd == "connect":  # one attempt: ok | timeout | refused | error N
    print(connect(float(args[0]))[0])
elif cmd == "until":  # attempts until one connects or args[0] s pass: ok | last failure
    end = time.monotonic() + float(args[0])
    while True:
        r, s = connect(0.5)
        if s or time.monotonic() > end:
            break
        time.sleep(0.05)
    print(r)
elif cmd == "rtt":  # the shortest of args[0] echo round trips, ms
    r, s = connect(30)
    assert s, r
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(30)
    best = 1e9
    for _ in range(int(args[0])):
        t = time.monotonic()
        s.sendall(b"x")
        assert s.recv(1) == b"x"
        best = min(best, time.monotonic() - t)
    print(round(best * 1000, 1))
elif cmd == "udp":  # send args[0] datagrams, paced; prints how many sendto accepted
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sent = 0
    for i in range(int(args[0])):
        try:
            u.sendto(b"d", (ip, port))
            sent += 1
        except OSError:
            pass
        if i % 20 == 19:
            time.sleep(0.001)
    print(sent)
elif cmd == "count":  # the server's UDP count, once it has seen a marker sent after
    def ask():
        s = socket.create_connection((ip, port), timeout=10)
        s.sendall(b"COUNT")
        v = tuple(map(int, s.makefile().readline().split()))
        s.close()
        return v
    _, marks = ask()
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    while True:  # a socket's datagrams are read in order: the marker comes after the rest
        u.sendto(b"m", (ip, port))
        time.sleep(0.05)
        count, now = ask()
        if now > marks:
            print(count)
            break
elif cmd == "probe":  # connect attempts (timeout args[1]) for args[0] s: "ok fail"
    ok = fail = 0
    end = time.monotonic() + float(args[0])
    while time.monotonic() < end:
        r, s = connect(float(args[1]))
        if s:
            s.close()
            ok += 1
        else:
            fail += 1
        time.sleep(0.02)
    print(ok, fail)
elif cmd == "session":  # connect, print the result, then one echo per stdin line
    r, s = connect(10)
    print(r, flush=True)
    s.settimeout(10)
    for line in sys.stdin:
        try:
            s.sendall(b"y")
            print("echo" if s.recv(1) == b"y" else "bad", flush=True)
        except OSError as e:
            print("error", e, flush=True)
"""


def client(lab: Lab, src: Host, cmd: str, dst: Host, *args: object, timeout: float = 60) -> str:
    """Run one CLIENT command in ``src``'s namespace against ``dst``'s server."""
    r = lab.run(
        src,
        [sys.executable, "-S", "-c", CLIENT, cmd, dst.ip, str(PORT), *map(str, args)],
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def start_server(lab: Lab, host: Host) -> subprocess.Popen[bytes]:
    proc = lab.popen(
        host,
        [sys.executable, "-S", "-c", SERVER, host.ip, str(PORT)],
        stdout=subprocess.PIPE,
    )
    assert read_line(proc, 30) == b"ready\n"
    return proc


def connects(lab: Lab, src: Host, dst: Host) -> bool:
    """Whether ``src`` can connect to ``dst``, waiting up to 10 s for it."""
    return client(lab, src, "until", dst, 10) == "ok"


def blocked(lab: Lab, src: Host, dst: Host) -> str:
    """One connect from ``src`` to ``dst`` with a short timeout: its outcome."""
    return client(lab, src, "connect", dst, 0.5)


def udp_delivered(lab: Lab, fault: Callable[[], None], src: Host, dst: Host, n: int) -> int:
    """Of ``n`` datagrams sent from ``src`` to ``dst`` under ``fault()``, how many ``dst``'s
    server counted (asked from the hub before the fault and after a heal)."""
    before = int(client(lab, lab.hub, "count", dst))
    fault()
    client(lab, src, "udp", dst, n)
    lab.heal()
    return int(client(lab, lab.hub, "count", dst)) - before


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with Lab() as lab:
        h1, h2 = lab.add_host("h1"), lab.add_host("h2")
        for h in (lab.hub, h1, h2):
            start_server(lab, h)
        yield lab


@pytest.fixture(autouse=True)
def healed(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "lab" in request.fixturenames:
        lab: Lab = request.getfixturevalue("lab")
        lab.heal()
        assert lab.faults() == []
        assert all(lab.rules(h) == [] for h in lab.hosts)


def test_connectivity_hub_and_hosts(lab: Lab) -> None:
    hub, h1, h2 = lab.hub, lab.host("h1"), lab.host("h2")
    assert len({hub.ip, h1.ip, h2.ip}) == 3
    assert all(h.ns.startswith(f"{PREFIX}{os.getpid()}-") for h in lab.hosts)
    for src, dst in [(hub, h1), (hub, h2), (h1, h2), (h2, h1), (h1, hub), (h2, hub)]:
        assert connects(lab, src, dst), (src, dst)


def test_enter_moves_a_process_into_the_hub(lab: Lab) -> None:
    """enter_netns (what Lab.enter does) in a process started in the root namespace."""
    code = (
        "import os, socket, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from chaos.netns import enter_netns\n"
        "before = os.stat('/proc/thread-self/ns/net').st_ino\n"
        "enter_netns(sys.argv[2])\n"
        "after = os.stat('/proc/thread-self/ns/net').st_ino\n"
        "s = socket.create_connection((sys.argv[3], int(sys.argv[4])), timeout=10)\n"
        "s.sendall(b'z')\n"
        "print(before, after, s.recv(1).decode())\n"
    )
    h1 = lab.host("h1")
    r = subprocess.run(
        [sys.executable, "-c", code, TESTS, lab.hub.ns, h1.ip, str(PORT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    before, after, echo = r.stdout.split()
    assert int(after) == os.stat(f"/run/netns/{lab.hub.ns}").st_ino != int(before)
    assert echo == "z"
    # and this process stayed where it was
    assert os.stat("/proc/thread-self/ns/net").st_ino == int(before)


def test_cut_times_out_and_heal_restores(lab: Lab) -> None:
    hub, h1, h2 = lab.hub, lab.host("h1"), lab.host("h2")
    lab.cut(h1, h2)
    lab.cut(hub, h2)
    assert blocked(lab, h1, h2) == "timeout"
    assert blocked(lab, h2, h1) == "timeout"
    assert blocked(lab, hub, h2) == "timeout"
    assert connects(lab, hub, h1)  # not involved
    lab.heal(h2, h1)  # only that pair
    assert connects(lab, h1, h2)
    assert connects(lab, h2, h1)
    assert blocked(lab, hub, h2) == "timeout"
    assert lab.faults() == ["cut hub<->h2"]
    lab.heal(h2)  # what touches h2
    assert connects(lab, hub, h2)
    whats = [what for _t, what in lab.events]
    assert "cut h1<->h2" in whats and "heal cut h1<->h2" in whats
    times = [t for t, _w in lab.events]
    assert times == sorted(times)


def test_cut_oneway_drops_one_direction(lab: Lab) -> None:
    h1, h2 = lab.host("h1"), lab.host("h2")
    lab.cut_oneway(h1, h2)
    assert blocked(lab, h1, h2) == "timeout"  # the SYN is lost
    assert udp_delivered(lab, lambda: lab.cut_oneway(h1, h2), h1, h2, 200) == 0
    assert udp_delivered(lab, lambda: lab.cut_oneway(h1, h2), h2, h1, 200) == 200
    assert connects(lab, h1, h2)


def test_block_connect_keeps_established_connections(lab: Lab) -> None:
    h1, h2 = lab.host("h1"), lab.host("h2")
    session = lab.popen(
        h2,
        [sys.executable, "-S", "-c", CLIENT, "session", h1.ip, str(PORT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert session.stdin is not None
    try:
        assert read_line(session, 30) == b"ok\n"
        lab.block_connect(h2, h1)  # h2 cannot connect to h1; h1 can connect to h2
        assert blocked(lab, h2, h1) == "timeout"
        assert connects(lab, h1, h2)
        session.stdin.write(b"go\n")
        session.stdin.flush()
        assert read_line(session, 30) == b"echo\n"  # the established one lives
        lab.heal()
        lab.block_connect(h2, h1, refuse=True)
        assert blocked(lab, h2, h1) == "refused"
        assert connects(lab, h1, h2)
    finally:
        lab.stop(session)
    lab.heal()
    assert connects(lab, h2, h1)


def test_isolate_cuts_a_host_from_all(lab: Lab) -> None:
    hub, h1, h2 = lab.hub, lab.host("h1"), lab.host("h2")
    lab.isolate(h1)
    assert blocked(lab, hub, h1) == "timeout"
    assert blocked(lab, h2, h1) == "timeout"
    assert blocked(lab, h1, h2) == "timeout"
    assert blocked(lab, h1, hub) == "timeout"
    assert connects(lab, hub, h2)
    assert client(lab, h1, "connect", h1, 2) == "ok"  # its own address, over loopback
    lab.heal(h1)
    assert connects(lab, hub, h1)
    assert connects(lab, h1, h2)


def test_loss_drops_all_or_some(lab: Lab) -> None:
    hub, h1 = lab.hub, lab.host("h1")
    assert udp_delivered(lab, lambda: lab.loss(hub, h1, 100), hub, h1, 200) == 0
    delivered = udp_delivered(lab, lambda: lab.loss(hub, h1, 30), hub, h1, 2000)
    assert 0.10 <= 1 - delivered / 2000 <= 0.60, delivered
    # the delayer's own loss
    assert udp_delivered(lab, lambda: lab.delay(hub, h1, 1, loss=100), hub, h1, 100) == 0
    assert udp_delivered(lab, lambda: None, hub, h1, 100) == 100


def test_delay_holds_every_packet(lab: Lab) -> None:
    hub, h1, h2 = lab.hub, lab.host("h1"), lab.host("h2")
    lab.delay(hub, h1, 200)
    assert float(client(lab, hub, "rtt", h1, 3)) >= 400.0
    assert connects(lab, hub, h2)  # not involved
    lab.heal()
    heal = next(what for _t, what in reversed(lab.events) if what.startswith("heal delay"))
    assert "packets=0" not in heal, heal  # both delayers held packets
    lab.delay(h1, h2, 100, jitter_ms=50)
    assert float(client(lab, h1, "rtt", h2, 3)) >= 100.0


def test_flap_toggles_then_heals(lab: Lab) -> None:
    h1, h2 = lab.host("h1"), lab.host("h2")
    flap = lab.flap(h1, h2, period=0.3, duration=120)
    ok, fail = map(int, client(lab, h1, "probe", h2, 2.0, 0.2).split())
    flap.stop()
    assert not flap.is_alive()
    assert ok > 0 and fail > 0, (ok, fail)
    assert flap.cuts >= 2
    assert lab.faults() == []
    assert connects(lab, h1, h2)
    whats = [what for _t, what in lab.events]
    assert whats.count("flap cut h1<->h2") == flap.cuts
    short = lab.flap(h1, h2, period=0.1, duration=0.5)  # ends by itself, healed
    short.join(30)
    assert not short.is_alive() and short.cuts >= 2
    assert lab.faults() == []


def test_tmpfs_fills_up(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    code = (
        "import errno, sys\n"
        "try:\n"
        "    with open(sys.argv[1], 'wb') as f:\n"
        "        for _ in range(1000):\n"
        "            f.write(b'x' * 65536)\n"
        "            f.flush()\n"
        "    print('no error')\n"
        "except OSError as e:\n"
        "    print(errno.errorcode[e.errno])\n"
    )
    with Lab() as lab:
        lab.tmpfs(disk, 1)
        assert os.path.ismount(disk)
        r = lab.run(lab.hub, [sys.executable, "-S", "-c", code, str(disk / "fill")])
        assert r.stdout.strip() == "ENOSPC", r
        (disk / "fill").unlink()
        # fill() from here: a process started before sees the same filesystem full
        writer = lab.popen(
            lab.hub,
            [
                sys.executable,
                "-S",
                "-c",
                "import sys; sys.stdin.readline(); " + code,
                str(disk / "w"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert writer.stdin is not None and writer.stdout is not None
        assert 0 < lab.fill(disk) <= 1 << 20
        writer.stdin.write(b"go\n")
        writer.stdin.flush()
        assert read_line(writer, 30) == b"ENOSPC\n"
        lab.unfill(disk)
        r = lab.run(lab.hub, [sys.executable, "-S", "-c", code, str(disk / "fill")])
        assert r.stdout.strip() == "ENOSPC", r  # a fresh 1 MiB to fill again
        assert [w for _t, w in lab.events if w.startswith(("fill", "unfill"))]
    assert not os.path.ismount(disk)


def _lab_namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.startswith(prefix)]


def test_close_removes_everything() -> None:
    with pytest.raises(RuntimeError, match="boom"), Lab() as lab:
        a, b = lab.add_host("a"), lab.add_host("b")
        sleeper = lab.popen(a, ["sleep", "600"])
        lab.delay(a, b, 50)
        flap = lab.flap(lab.hub, b, period=0.2, duration=600)
        assert len(_lab_namespaces(lab.prefix)) == 3
        raise RuntimeError("boom")
    assert _lab_namespaces(lab.prefix) == []
    assert sleeper.poll() is not None
    assert not flap.is_alive()
    assert "closed" in [what for _t, what in lab.events]
    lab.close()  # idempotent


def test_leftovers_of_a_dead_pid_are_swept() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(dead.pid, 0)
    ns = f"{PREFIX}{dead.pid}-0-left"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    inside = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "600"])
    try:
        with Lab() as lab:
            assert ns not in _lab_namespaces(PREFIX)
            assert inside.wait(10) == -signal.SIGKILL
            assert any(ns in what for _t, what in lab.events)
    finally:
        if inside.poll() is None:
            inside.kill()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
