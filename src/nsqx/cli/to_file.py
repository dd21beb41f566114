"""``nsqx to-file``: archive topics to rotating files, as NSQ's ``nsq_to_file``.

Each topic is consumed on ``--channel`` and every body is written as one line. Files
are named by ``--filename-format`` (``<TOPIC>``, ``<HOST>``, ``<PID>``, ``<DATETIME>``
from ``--datetime-format``, ``<REV>`` = ``-000000``, ``-000001``, ... for files that
would otherwise have the same name), as the Go tool names them; ``--gzip`` adds
``.gz``. A file is rotated when its name changes (the hour, with the default format),
when ``--rotate-size`` bytes were written to it, or after ``--rotate-interval``.
Messages are finished only once their line is fsynced: after ``--max-in-flight`` lines,
every ``--sync-interval``, when the consumer would otherwise starve, or 200 ms after the
first line not yet synced (so a quiet topic's last lines do not wait for the interval). With gzip each
sync ends one gzip member (readers see one concatenated stream), as in the Go tool.
With ``--work-dir`` files are written there and moved to ``--output-dir`` when closed.
Without ``--topic``, every topic nsqlookupd lists (matching ``--topic-pattern``) is
archived, and new ones are picked up every ``--topic-refresh``. SIGHUP closes the open
files (the next message opens new ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import re
import signal
import socket
import sys
import time
from typing import IO, Any

import aiohttp

from nsqx.cli.toolbase import (
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    CONNECT_TIMEOUT,
    CONSUMER_OPT,
    LOOKUPD_HTTP,
    MAX_IN_FLIGHT,
    NSQD_TCP,
    PROGRESS,
    REQUEST_TIMEOUT,
    VERSION,
    Kind,
    Progress,
    Tool,
    ToolError,
    auth_secret,
    bearer_headers,
    check_lookupds,
    check_name,
    check_nsqds,
    check_one_source,
    client_config,
    flag,
    user_agent,
)
from nsqx.client import Consumer, Message
from nsqx.clusterinfo.info import ClusterInfo, UpstreamError

FLAGS = (
    VERSION,
    flag("log-level", Kind.STR, "info", "accepted for compatibility"),
    flag("log-prefix", Kind.STR, "[nsq_to_file] ", "accepted for compatibility"),
    flag("channel", Kind.STR, "nsq_to_file", "nsq channel", "channel"),
    MAX_IN_FLIGHT,
    flag("output-dir", Kind.STR, "/tmp", "directory to write output files to", "dir"),
    flag(
        "work-dir",
        Kind.STR,
        "",
        "directory for in-progress files before moving to output-dir",
        "dir",
    ),
    flag(
        "datetime-format",
        Kind.STR,
        "%Y-%m-%d_%H",
        "strftime compatible format for <DATETIME> in filename format",
    ),
    flag(
        "filename-format",
        Kind.STR,
        "<TOPIC>.<HOST><REV>.<DATETIME>.log",
        "output filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV> are replaced;"
        " <REV> is increased when the file already exists)",
    ),
    flag(
        "host-identifier",
        Kind.STR,
        "",
        "value for <HOST> in filenames (<SHORT_HOST> and <HOSTNAME> are replaced)",
    ),
    flag("gzip-level", Kind.INT, 6, "gzip compression level (1-9, 1=BestSpeed, 9=BestCompression)"),
    flag("gzip", Kind.BOOL, False, "gzip output files"),
    flag("skip-empty-files", Kind.BOOL, False, "skip writing empty files"),
    flag("topic-refresh", Kind.DURATION, 60.0, "how frequently the topic list should be refreshed"),
    flag("topic-pattern", Kind.STR, "", "only log topics matching this regular expression"),
    flag("rotate-size", Kind.INT, 0, "rotate the file when it grows bigger than this many bytes"),
    flag("rotate-interval", Kind.DURATION, 0.0, "rotate the file every duration"),
    flag("sync-interval", Kind.DURATION, 30.0, "sync file to disk every duration"),
    CONNECT_TIMEOUT,
    REQUEST_TIMEOUT,
    NSQD_TCP,
    LOOKUPD_HTTP,
    flag("topic", Kind.STR_LIST, [], "nsq topic", "topic"),
    CONSUMER_OPT,
    AUTH_SECRET,
    AUTH_SECRET_FILE,
    PROGRESS,
)

#: lines are synced and finished at the latest this long after the first unsynced one
_QUIET_SYNC = 0.2

EXAMPLES = """
  nsqx to-file --topic=events --lookupd-http-address=127.0.0.1:4161 --output-dir=/data/nsq
  nsqx to-file --topic=events --nsqd-tcp-address=127.0.0.1:4150 --output-dir=/data/nsq \\
               --gzip --rotate-size=104857600 --rotate-interval=1h
  nsqx to-file --topic-pattern='^web-' --lookupd-http-address=127.0.0.1:4161 \\
               --output-dir=/data/nsq --work-dir=/data/nsq/.tmp
"""


def filename_format(opts: dict[str, Any], topic: str) -> str:
    """The Go tool's name template for ``topic``, with all but <DATETIME> filled in."""
    hostname = socket.gethostname()
    short = hostname.split(".")[0]
    identifier = short
    if opts["host_identifier"]:
        identifier = (
            opts["host_identifier"].replace("<SHORT_HOST>", short).replace("<HOSTNAME>", hostname)
        )
    fmt: str = opts["filename_format"]
    if (
        opts["gzip"]
        or opts["rotate_size"] > 0
        or opts["rotate_interval"] > 0
        or (opts["work_dir"] != opts["output_dir"])
    ):
        if "<REV>" not in fmt:
            raise ToolError(
                "missing <REV> in --filename-format when gzip, rotation, or work dir enabled"
            )
    else:
        fmt = fmt.replace("<REV>", "")  # never needed: files are appended to
    fmt = fmt.replace("<TOPIC>", topic).replace("<HOST>", identifier)
    fmt = fmt.replace("<PID>", str(os.getpid()))
    if opts["gzip"] and not fmt.endswith(".gz"):
        fmt += ".gz"
    return fmt


class FileLogger:
    """One topic's consumer and its current output file."""

    def __init__(self, opts: dict[str, Any], topic: str, progress: Progress) -> None:
        self.opts = opts
        self.topic = topic
        self.progress = progress
        self.template = filename_format(opts, topic)
        self.out: IO[bytes] | None = None
        self.gz: gzip.GzipFile | None = None
        self.filename = ""
        self.path = ""
        self.rev = 0
        self.opened_at = 0.0
        self.size = 0
        self.pending: list[Message] = []
        self.consumer: Consumer | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._soon: asyncio.TimerHandle | None = None

    def log(self, text: str) -> None:
        print(f"[{self.topic}/{self.opts['channel']}] {text}", file=sys.stderr)

    # -- files ---------------------------------------------------------------------------

    def current_filename(self) -> str:
        return self.template.replace(
            "<DATETIME>", time.strftime(self.opts["datetime_format"], time.localtime())
        )

    def needs_rotation(self) -> bool:
        if self.out is None:
            return True
        if self.current_filename() != self.filename:
            return True
        interval = self.opts["rotate_interval"]
        if interval > 0 and time.monotonic() - self.opened_at > interval:
            return True
        limit = self.opts["rotate_size"]
        return bool(limit > 0 and self.size > limit)

    def update_file(self) -> None:
        """Close the current file and open the next one (the next free <REV>)."""
        self.close_file()
        filename = self.current_filename()
        if filename != self.filename:
            self.rev = 0
        else:
            self.rev += 1
        self.filename = filename
        self.opened_at = time.monotonic()
        work, output = self.opts["work_dir"], self.opts["output_dir"]
        while True:
            name = filename.replace("<REV>", f"-{self.rev:06d}")
            path = os.path.join(work, name)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            if work != output:
                final = os.path.join(output, name)
                os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
                if os.path.exists(final):
                    self.rev += 1
                    continue
            flags = os.O_WRONLY | os.O_CREAT
            if self.opts["gzip"] or self.opts["rotate_interval"] > 0:
                flags |= os.O_EXCL
            else:
                flags |= os.O_APPEND
            try:
                fd = os.open(path, flags, 0o666)
            except FileExistsError:
                self.rev += 1
                continue
            out = os.fdopen(fd, "ab" if flags & os.O_APPEND else "wb")
            size = os.fstat(fd).st_size
            limit = self.opts["rotate_size"]
            if limit > 0 and size > limit:
                out.close()
                self.rev += 1
                continue
            break
        self.log(f"opening {path}")
        self.out, self.path, self.size = out, path, size
        self.gz = None
        if self.opts["gzip"]:
            self.gz = gzip.GzipFile(fileobj=out, mode="wb", compresslevel=self.opts["gzip_level"])

    def write(self, data: bytes) -> None:
        target: IO[bytes] | gzip.GzipFile | None = self.gz or self.out
        assert target is not None
        target.write(data)
        self.size += len(data)

    def sync(self) -> None:
        """Make what was written durable, then finish its messages."""
        if self.out is not None:
            if self.gz is not None:
                # end this gzip member (its trailer checks what was acknowledged)
                self.gz.close()
                self.gz = gzip.GzipFile(
                    fileobj=self.out, mode="wb", compresslevel=self.opts["gzip_level"]
                )
            self.out.flush()
            os.fsync(self.out.fileno())
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        pending, self.pending = self.pending, []
        for msg in pending:
            with contextlib.suppress(Exception):  # its connection may be gone
                msg.finish()

    def close_file(self) -> None:
        """Sync and close the current file; move it to --output-dir if it is elsewhere."""
        if self.out is None:
            return
        if self.gz is not None:
            self.gz.close()
            self.gz = None
        self.out.flush()
        os.fsync(self.out.fileno())
        self.out.close()
        self.out = None
        work, output = self.opts["work_dir"], self.opts["output_dir"]
        if work == output:
            return
        rel = os.path.relpath(self.path, work)
        rev = self.rev
        dst = os.path.join(output, rel)
        while True:
            try:
                # link + unlink: never replaces a file that appeared meanwhile
                os.link(self.path, dst)
            except FileExistsError:
                rev += 1
                dst = os.path.join(output, self.filename.replace("<REV>", f"-{rev:06d}"))
                continue
            os.unlink(self.path)
            self.log(f"moved finished file {self.path} to {dst}")
            return

    # -- consuming -----------------------------------------------------------------------

    def handle(self, msg: Message) -> None:
        msg.enable_async()  # finished after the fsync
        if self.needs_rotation():
            self.update_file()
            self.sync()
        self.write(msg.body + b"\n")
        self.pending.append(msg)
        self.progress.add()
        full = len(self.pending) >= self.opts["max_in_flight"]
        if full or (self.consumer is not None and self.consumer.is_starved()):
            self.sync()
        elif self._soon is None:
            # a quiet topic's last lines are not left unfinished until --sync-interval
            self._soon = asyncio.get_running_loop().call_later(_QUIET_SYNC, self._quiet_sync)

    def _quiet_sync(self) -> None:
        self._soon = None
        self.sync()

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(self.opts["sync_interval"])
            if self.out is not None and self.needs_rotation():
                if self.opts["skip_empty_files"]:
                    self.sync()
                    self.close_file()
                else:
                    self.update_file()
            self.sync()

    async def start(self, config: Any) -> None:
        self.consumer = Consumer(
            self.topic,
            self.opts["channel"],
            self.handle,
            nsqd_tcp_addresses=self.opts["nsqd_tcp_address"],
            lookupd_http_addresses=self.opts["lookupd_http_address"],
            config=config,
        )
        await self.consumer.start()
        self._ticker = asyncio.ensure_future(self.tick())

    def hup(self) -> None:
        self.sync()
        self.close_file()

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self.consumer is not None:
            # CLS, then answer what is in flight: write it out and finish it
            closing = asyncio.ensure_future(self.consumer.close(timeout=10))
            while not closing.done():
                self.sync()
                await asyncio.wait({closing}, timeout=0.05)
            with contextlib.suppress(Exception):
                closing.result()
        self.sync()
        self.close_file()


async def main(opts: dict[str, Any]) -> int:
    if not opts["channel"]:
        raise ToolError("--channel is required")
    check_name("channel", opts["channel"], "channel")
    for name in ("http_client_connect_timeout", "http_client_request_timeout"):
        if opts[name] <= 0:
            raise ToolError(f"--{name.replace('_', '-')} should be positive")
    check_one_source(opts)
    if not 1 <= opts["gzip_level"] <= 9:
        raise ToolError(f"invalid --gzip-level value ({opts['gzip_level']}), should be 1-9")
    if not opts["topic"] and not opts["topic_pattern"]:
        raise ToolError("--topic or --topic-pattern required")
    if not opts["topic"] and not opts["lookupd_http_address"]:
        raise ToolError("--lookupd-http-address must be specified when no --topic specified")
    for topic in opts["topic"]:
        check_name("topic", topic, "topic")
    pattern = None
    if opts["topic_pattern"]:
        try:
            pattern = re.compile(opts["topic_pattern"])
        except re.error as err:
            raise ToolError(f"--topic-pattern: {err}") from None
    if opts["sync_interval"] <= 0:
        raise ToolError("--sync-interval should be positive")
    if not opts["work_dir"]:
        opts["work_dir"] = opts["output_dir"]
    for key in ("output_dir", "work_dir"):
        try:
            os.makedirs(opts[key], exist_ok=True)
        except OSError as err:
            raise ToolError(f"--{key.replace('_', '-')}: {opts[key]}: {err.strerror}") from None
    # fail on a bad template now rather than when the first message arrives
    filename_format(opts, "topic")
    secret = auth_secret(opts)
    config = client_config(
        opts["consumer_opt"],
        "consumer-opt",
        secret,
        user_agent=user_agent("nsq_to_file"),
        max_in_flight=opts["max_in_flight"],
    )
    if opts["nsqd_tcp_address"]:
        await check_nsqds(opts["nsqd_tcp_address"], config=config)
    else:
        found = await check_lookupds(
            opts["lookupd_http_address"], secret=secret, topics=opts["topic"]
        )
        await check_nsqds(found, config=config, secret_only=True)

    progress = Progress("nsqx to-file", "messages", opts["progress_interval"])
    loggers: dict[str, FileLogger] = {}

    async def add(topics: list[str]) -> None:
        for topic in topics:
            if topic in loggers:
                continue
            if pattern is not None and not pattern.search(topic):
                continue
            fl = FileLogger(opts, topic, progress)
            loggers[topic] = fl
            await fl.start(config)

    def hup() -> None:
        for fl in loggers.values():
            fl.hup()

    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGHUP, hup)
    progress.start()
    timeout = aiohttp.ClientTimeout(
        total=opts["http_client_request_timeout"], sock_connect=opts["http_client_connect_timeout"]
    )
    try:
        async with aiohttp.ClientSession(
            timeout=timeout, headers=bearer_headers(secret)
        ) as session:
            ci = ClusterInfo(session, opts["lookupd_http_address"])
            if opts["topic"]:
                await add(opts["topic"])
                await asyncio.Event().wait()  # until stopped
            while True:
                try:
                    topics, _ = await ci.lookupd_topics()
                    await add(topics)
                except UpstreamError as err:
                    print(f"nsqx to-file: could not retrieve topic list: {err}", file=sys.stderr)
                await asyncio.sleep(opts["topic_refresh"])
    finally:
        for fl in loggers.values():
            await fl.stop()
        await progress.stop("nsqx to-file: wrote {count} messages in {seconds:.1f}s")
    return 0


TOOL = Tool(
    "to-file",
    "nsq_to_file",
    FLAGS,
    "Archive topics to rotating files (NSQ's nsq_to_file).",
    EXAMPLES,
    main,
)
