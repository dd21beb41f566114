"""A user-space packet delayer: an NFQUEUE consumer that holds each packet, then accepts it.

This kernel has no ``tc netem``, so delay is done here: an iptables rule sends packets to
``NFQUEUE --queue-num N --queue-bypass``; this process binds queue N over a raw
``NETLINK_NETFILTER`` socket (nfnetlink_queue, copy mode META: the kernel sends only the
packet id, never the payload), and gives each packet its ``NF_ACCEPT`` verdict once its
due time (arrival + delay +- jitter) has come. Verdicts may go out of order (jitter), so
the held packets sit in a heap of due times; all verdicts due at one moment go to the
kernel in one datagram. ``--loss`` drops that percentage of packets (``NF_DROP``) at once.

Run it inside the namespace whose rule names the queue::

    ip netns exec NS python tests/chaos/nfqdelay.py --queue N --delay-ms 200 \\
        [--jitter-ms J] [--loss PCT] [--seed S]

It prints ``ready`` on stdout once the queue is bound (so a rule added after that line
delays every packet), and on SIGTERM/SIGINT accepts every packet it still holds, unbinds,
prints one ``stats ...`` line and exits 0. It also exits when its parent dies. Once it has
gone, ``--queue-bypass`` lets the rule's packets through undelayed.

Standard library only.
"""

from __future__ import annotations

import argparse
import errno
import heapq
import os
import random
import resource
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
SO_RCVBUFFORCE = 33  # Linux; the socket module does not export it

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4

NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2

NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2

NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_COPY_META = 1
# queue GSO/GRO super-packets whole instead of segmenting them first: we never look at
# the payload, so a 64 KiB TSO packet is one verdict instead of ~45
NFQA_CFG_F_GSO = 1 << 2

NF_DROP = 0
NF_ACCEPT = 1

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, portid
_NFGENMSG = struct.Struct("!BBH")  # family, version, res_id (queue number, big-endian)
_NLATTR = struct.Struct("=HH")  # len, type
_VERDICT = struct.Struct("!II")  # verdict, packet id

_PACKET_TYPE = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET
_VERDICT_TYPE = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_VERDICT
_CONFIG_TYPE = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_CONFIG


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attr(kind: int, payload: bytes) -> bytes:
    n = _NLATTR.size + len(payload)
    return _NLATTR.pack(n, kind) + payload + b"\0" * (_align(n) - n)


def _message(kind: int, flags: int, seq: int, queue: int, attrs: bytes) -> bytes:
    body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, queue) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, seq, 0) + body


class NfQueue:
    """One bound nfnetlink queue (copy mode META)."""

    def __init__(self, queue: int, maxlen: int = 16384) -> None:
        self.queue = queue
        self.seq = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self.sock.bind((0, 0))
            try:
                # root: beyond net.core.rmem_max, so a burst does not overflow the socket
                self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
            except OSError:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
            try:
                self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
            except OSError:
                pass
            self._config(_attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)))
            self._config(
                _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
                + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))
            )
            try:
                self._config(
                    _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))
                    + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO))
                )
            except OSError:
                pass  # an old kernel without the flag: packets come segmented, still fine
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise

    def _config(self, attrs: bytes) -> None:
        """Send one NFQNL_MSG_CONFIG and wait for its ack; OSError on a kernel error."""
        self.seq += 1
        seq = self.seq
        self.sock.send(_message(_CONFIG_TYPE, NLM_F_REQUEST | NLM_F_ACK, seq, self.queue, attrs))
        while True:
            data = self.sock.recv(65536)
            for kind, mseq, payload in _messages(data):
                if kind == NLMSG_ERROR and mseq == seq:
                    (err,) = struct.unpack_from("=i", payload)
                    if err:
                        raise OSError(-err, f"nfqueue {self.queue} config: {os.strerror(-err)}")
                    return

    def unbind(self) -> None:
        try:
            self.sock.setblocking(True)
            self.sock.settimeout(1.0)
            self._config(_attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_UNBIND, 0)))
        except OSError:
            pass

    def verdicts(self, items: list[tuple[int, int]]) -> None:
        """Send (packet id, verdict) pairs, many netlink messages per datagram."""
        for start in range(0, len(items), 256):
            chunk = b"".join(
                _message(
                    _VERDICT_TYPE,
                    NLM_F_REQUEST,
                    0,
                    self.queue,
                    _attr(NFQA_VERDICT_HDR, _VERDICT.pack(verdict, pid)),
                )
                for pid, verdict in items[start : start + 256]
            )
            while True:
                try:
                    self.sock.send(chunk)
                    break
                except BlockingIOError:
                    select.select([], [self.sock], [], 0.05)

    def close(self) -> None:
        self.sock.close()


def _messages(data: bytes) -> list[tuple[int, int, bytes]]:
    """Split one netlink datagram into (type, seq, payload after the nlmsghdr)."""
    out = []
    off = 0
    while off + _NLMSGHDR.size <= len(data):
        n, kind, _flags, seq, _portid = _NLMSGHDR.unpack_from(data, off)
        if n < _NLMSGHDR.size:
            break
        out.append((kind, seq, data[off + _NLMSGHDR.size : off + n]))
        off += _align(n)
    return out


def _packet_id(payload: bytes) -> int | None:
    """The packet id of one NFQNL_MSG_PACKET payload (nfgenmsg + attributes)."""
    off = _NFGENMSG.size
    while off + _NLATTR.size <= len(payload):
        n, kind = _NLATTR.unpack_from(payload, off)
        if n < _NLATTR.size:
            return None
        if kind & 0x3FFF == NFQA_PACKET_HDR:
            return int(struct.unpack_from("!I", payload, off + _NLATTR.size)[0])
        off += _align(n)
    return None


def run(
    queue: int,
    delay_s: float,
    jitter_s: float = 0.0,
    loss: float = 0.0,
    seed: int | None = None,
    maxlen: int = 16384,
) -> dict[str, int]:
    """Delay every packet of ``queue`` until SIGTERM/SIGINT or the parent's death."""
    rng = random.Random(seed)
    stop = False

    def on_signal(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    nfq = NfQueue(queue, maxlen)
    parent = os.getppid()
    stats = {"packets": 0, "accepted": 0, "dropped": 0, "flushed": 0}
    held: list[tuple[float, int, int]] = []  # (due, arrival order, packet id)
    order = 0
    print("ready", flush=True)
    next_parent_check = time.monotonic() + 1.0
    sock = nfq.sock
    recv = sock.recv
    try:
        while not stop:
            now = time.monotonic()
            if now >= next_parent_check:
                if os.getppid() != parent:
                    break
                next_parent_check = now + 1.0
            timeout = 1.0 if not held else max(0.0, min(1.0, held[0][0] - now))
            readable, _, _ = select.select([sock, wake_r], [], [], timeout)
            if wake_r in readable:
                try:
                    wake_r.recv(4096)
                except BlockingIOError:
                    pass
            if sock in readable:
                drops: list[tuple[int, int]] = []
                now = time.monotonic()
                # drain everything queued now: one wakeup, many packets
                for _ in range(4096):
                    try:
                        data = recv(65536)
                    except BlockingIOError:
                        break
                    except OSError as e:
                        if e.errno == errno.ENOBUFS:  # overran: the kernel dropped some
                            continue
                        raise
                    for kind, _seq, payload in _messages(data):
                        if kind != _PACKET_TYPE:
                            continue
                        pid = _packet_id(payload)
                        if pid is None:
                            continue
                        stats["packets"] += 1
                        if loss and rng.random() * 100.0 < loss:
                            drops.append((pid, NF_DROP))
                            continue
                        due = now + delay_s
                        if jitter_s:
                            due = max(now, due + rng.uniform(-jitter_s, jitter_s))
                        order += 1
                        heapq.heappush(held, (due, order, pid))
                if drops:
                    stats["dropped"] += len(drops)
                    nfq.verdicts(drops)
            if held:
                now = time.monotonic()
                due_now: list[tuple[int, int]] = []
                while held and held[0][0] <= now:
                    due_now.append((heapq.heappop(held)[2], NF_ACCEPT))
                if due_now:
                    stats["accepted"] += len(due_now)
                    nfq.verdicts(due_now)
    finally:
        # hand back what we hold instead of letting the kernel drop it with the queue
        if held:
            stats["flushed"] = len(held)
            nfq.verdicts([(pid, NF_ACCEPT) for _due, _o, pid in held])
        nfq.unbind()
        nfq.close()
        signal.set_wakeup_fd(-1)
        wake_r.close()
        wake_w.close()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        stats["cpu_ms"] = round((ru.ru_utime + ru.ru_stime) * 1000)
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queue", type=int, required=True, help="NFQUEUE number to bind")
    p.add_argument("--delay-ms", type=float, default=0.0, help="hold each packet this long")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="+- uniform jitter (reorders)")
    p.add_argument("--loss", type=float, default=0.0, help="drop this percentage of packets")
    p.add_argument("--seed", type=int, default=None, help="seed of the loss/jitter random")
    p.add_argument("--maxlen", type=int, default=16384, help="kernel queue length")
    a = p.parse_args(argv)
    try:
        stats = run(a.queue, a.delay_ms / 1000.0, a.jitter_ms / 1000.0, a.loss, a.seed, a.maxlen)
    except OSError as e:
        print(f"nfqdelay: {e}", file=sys.stderr, flush=True)
        return 1
    print("stats " + " ".join(f"{k}={v}" for k, v in stats.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
