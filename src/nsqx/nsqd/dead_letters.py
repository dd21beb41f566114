"""Dead letters: a message delivered ``max_attempts`` times goes to a topic of its own.

NSQ only has the clients' MaxAttempts, which drops the message with a log line (nsq
#974, #1518, #591, #1309). Here a channel with a policy (nsqx.nsqd.channel_policy)
publishes such a message to its dead-letter topic instead of delivering it again, and
finishes it only once that publish is acknowledged: a crash in between leaves the
message queued (it dies again on restart), never lost. The channel checkpoints as soon
as the dead letter is written, so a second copy needs a crash in that instant.

A dead letter is a JSON envelope (format ``json``: any NSQ client reads it) or the
original body with the facts in its JSON ext header (format ``ext``, on an ``extend``
topic). :func:`replay` gives a channel its dead letters back, from the original log.
See docs/dead-letters.md.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from nsqx.nsqd import clock
from nsqx.nsqd.channel_policy import FORMAT_EXT, ReplayMark, mark_key
from nsqx.nsqd.publishing import ext_fields, pub_partition
from nsqx.store.log import MessageLog, records
from nsqx.wire.errors import ProtocolError
from nsqx.wire.frames import ID_AT, ID_END, record_parts, timestamp_of

if TYPE_CHECKING:
    from nsqx.nsqd.channel import Channel
    from nsqx.nsqd.nsqd import NSQD
    from nsqx.nsqd.workers.forwarding import Ticket

log = logging.getLogger("nsqx.nsqd")

#: the ext header keys of a dead letter (format ``ext``); the JSON envelope has the same
#: facts under the names without the prefix
PREFIX: Final = "dead_letter_"

#: dead letters looked at by one replay call, at most
MAX_REPLAY: Final = 100_000


class DeadLetterRefused(Exception):
    """The dead-letter topic's owner (another worker) refused the publish."""


def facts(ch: Channel, frame: bytes, attempts: int, first_ns: int, last_ns: int) -> dict[str, Any]:
    """What a dead letter says of its message: where it came from, its id, how often
    it was delivered and when (wall ns; 0: not known)."""
    return {
        "topic": ch.topic.name,
        "channel": ch.name,
        "partition": ch.partition.id,
        "id": frame[ID_AT:ID_END].decode("ascii", "replace"),
        "attempts": attempts,
        "timestamp": timestamp_of(frame),
        "first_delivery": first_ns,
        "last_delivery": last_ns,
        "dead_at": clock.time_ns(),
    }


def envelope(
    ch: Channel, frame: bytes, attempts: int, first_ns: int, last_ns: int, fmt: str
) -> tuple[bytes, bytes | None]:
    """The dead letter of ``frame`` as (body, ext header or None)."""
    about = facts(ch, frame, attempts, first_ns, last_ns)
    trace_id, _ver, ext, body_at = record_parts(frame)
    body = frame[body_at:]
    if fmt == FORMAT_EXT:
        header: dict[str, Any] = {}
        if ext:
            try:
                original = json.loads(ext)
                if isinstance(original, dict):
                    header.update(original)
            except ValueError:
                pass  # (a tag, not a JSON header: dropped)
        header.update({PREFIX + k: str(v) for k, v in about.items()})
        return body, json.dumps(header, separators=(",", ":")).encode()
    if trace_id:
        about["trace_id"] = str(trace_id)
    if ext:
        about["ext"] = ext.decode("utf-8", "replace")
    try:
        about["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        about["body_base64"] = base64.b64encode(body).decode("ascii")
    return json.dumps(about, separators=(",", ":")).encode(), None


def publish(
    nsqd: NSQD,
    ch: Channel,
    frame: bytes,
    attempts: int,
    first_ns: int,
    last_ns: int,
    on_done: Callable[[BaseException | None], None],
) -> None:
    """Publish ``frame``'s dead letter to ``ch``'s dead-letter topic; ``on_done(None)``
    once it is acknowledged there (as a PUB would be answered), ``on_done(err)`` if it
    was refused or failed. Never calls ``on_done`` before returning."""
    policy = ch.policy
    name = policy.dead_letter_topic_for(ch.topic.name)
    body, header = envelope(ch, frame, attempts, first_ns, last_ns, policy.dead_letter_format)
    loop = asyncio.get_running_loop()
    workers = nsqd.workers
    if workers is not None:
        owner = workers.owner(name, -1)
        if owner != workers.index:

            def answered(ticket: Ticket, err: BaseException | None) -> None:
                if err is None and ticket.answer:  # (b"": the OK)
                    err = DeadLetterRefused(ticket.answer[8:].decode("utf-8", "replace"))
                on_done(err)

            verb = "PUB" if header is None else "PUB_EXT"
            headers = None if header is None else [header]
            workers.forward(owner, 0, answered, verb, name, -1, [body], headers=headers)
            return
    try:
        traces: list[int] | None = None
        exts: list[tuple[int, bytes]] | None = None
        if header is not None:
            trace_list, exts = ext_fields(nsqd, name, [header])
            traces = [t or 0 for t in trace_list] if any(trace_list) else None
        part = pub_partition(nsqd, nsqd.topics, name, -1)
        part.publish([body], 0, traces, exts)
    except (ProtocolError, OSError) as err:
        loop.call_soon(on_done, err)
        return

    def acknowledged(err: BaseException | None) -> None:
        loop.call_soon(on_done, err)  # (never inside the pump that made it)

    part.when_acknowledged(acknowledged)


def _origin(frame: bytes) -> dict[str, Any] | None:
    """The facts of a dead letter (either format), None if it is not one."""
    _trace_id, _ver, ext, body_at = record_parts(frame)
    try:
        if ext:
            header = json.loads(ext)
            if isinstance(header, dict) and PREFIX + "id" in header:
                return {k[len(PREFIX) :]: v for k, v in header.items() if k.startswith(PREFIX)}
        doc = json.loads(frame[body_at:])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and "id" in doc else None


async def checkpointed(nsqd: NSQD) -> None:
    """Wait until the channels changed so far are checkpointed: the dead letters a
    replay queued again are on disk before its marks are (nsqd.dat), so a crash between
    the two writes can give a dead letter back twice (as for any redelivery), never
    lose it."""
    checkpointer = nsqd.checkpointer
    await checkpointer.drain()  # (a round under way may have begun before the replay)
    checkpointer.run_round()
    await checkpointer.drain()


def adopt_legacy_mark(nsqd: NSQD, ch: Channel, seq: int) -> None:
    """A replay mark of nsqd.dat as releases before marks per dead-letter topic wrote it
    (one number: how far replays had looked in the dead-letter topic, its default
    partition): the mark of the topic the channel's policy names (which it named then,
    unless changed since: the old mark did not say)."""
    name = ch.policy.dead_letter_topic_for(ch.topic.name)
    topic = nsqd.topics.get(name)
    pid = topic.default_partition.id if topic is not None and topic.partitions else 0
    ch.replay_marks.setdefault(mark_key(name, pid), (seq, 0))


def _replay_start(log_: MessageLog, mark: ReplayMark | None) -> int:
    """Where a replay looks first in a dead-letter log: after the last dead letter it
    looked at, if that record is still the one it saw (a topic deleted and made again
    starts over at its oldest record; so does a mark beyond the log's end)."""
    if mark is None:
        return log_.start
    seq, ts = mark
    if seq > log_.end:
        return log_.start
    if ts and log_.start < seq:
        last = log_.get(seq - 1)
        if last is not None and timestamp_of(last) != ts:
            return log_.start
    return max(seq, log_.start)


def replay(nsqd: NSQD, ch: Channel, n: int) -> dict[str, int]:
    """Give ``ch`` back up to ``n`` of its dead letters: each one whose original message
    is still in the partition's log is queued again on this channel alone, its attempts
    starting over; one whose original is gone (retention reclaimed it) is counted as
    ``missing``. Looks through each local partition of the dead-letter topic from where
    the last replay there stopped (``ch.replay_marks``, one mark per dead-letter topic and
    partition: a policy that names another topic, and back, neither repeats nor skips a
    dead letter)."""
    part = ch.partition
    name = ch.policy.dead_letter_topic_for(ch.topic.name)
    topic = nsqd.topics.get(name)
    out = {"replayed": 0, "missing": 0, "scanned": 0}
    if topic is None or not topic.partitions:
        return out
    pending = set(ch.cursor_state().pending[::3])
    requeued = ch.flight.requeued
    marks = ch.replay_marks
    for dead in sorted(topic.partitions.values(), key=lambda p: p.id):
        if out["replayed"] + out["missing"] >= n or out["scanned"] >= MAX_REPLAY:
            break
        key = mark_key(name, dead.id)
        start = _replay_start(dead.log, marks.get(key))
        mark: ReplayMark | None = None
        for seq, frame in records(dead.log, start, dead.visible_end):
            if out["replayed"] + out["missing"] >= n or out["scanned"] >= MAX_REPLAY:
                break
            mark = (seq + 1, timestamp_of(frame))
            out["scanned"] += 1
            about = _origin(frame)
            if (
                about is None
                or about.get("topic") != ch.topic.name
                or about.get("channel") != ch.name
                or str(about.get("partition")) != str(part.id)
            ):
                continue
            try:
                orig = part.seq_of(str(about["id"]).encode())
            except ValueError:
                continue
            original = part.log.get(orig) if orig < ch.cursor else None
            if original is None or original[ID_AT:ID_END] != str(about["id"]).encode():
                out["missing"] += 1
                continue
            if orig not in pending:
                pending.add(orig)
                requeued.append((orig, 0))  # (0: delivered as a first attempt)
            out["replayed"] += 1
        if mark is not None:
            marks[key] = mark
    ch.dirty = True
    if out["replayed"]:
        log.info("CHANNEL(%s): %d dead letters replayed", ch.name, out["replayed"])
        ch.notify()
    return out
