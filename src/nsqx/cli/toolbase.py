"""What NSQ's small tools share: their flags, go-nsq's ``--consumer-opt``, errors, progress.

Each tool (``nsqx tail``, ``pub``, ``to-file``, ``to-http``, ``to-nsq``, ``stat``,
``bench``) is a module of :mod:`nsqx.cli` with a :class:`Tool`: its Go flags (as
:class:`~nsqx.cli.goflags.FlagSpec` rows), examples for ``--help``, and an async
``main``. :func:`run_tool` gives them one behaviour for what goes wrong: a bad flag is
one line and exit 2; a :class:`ToolError` (unreachable server, bad topic name, ...) is
one line and exit 1; Ctrl-C or SIGTERM stops the tool cleanly. No traceback reaches the
operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import aiohttp

from nsqx import NSQ_VERSION, __version__
from nsqx.admin.cluster import http_base
from nsqx.cli.goflags import FlagError, FlagSet, FlagSpec, HelpRequested, Kind, parse_go_bool
from nsqx.client import Config, ConfigError, NSQError
from nsqx.client.conn import split_address
from nsqx.wire.names import is_valid_name

__all__ = [
    "CONNECT_TIMEOUT",
    "CONSUMER_OPT",
    "LOOKUPD_HTTP",
    "MAX_IN_FLIGHT",
    "NSQD_HTTP",
    "NSQD_TCP",
    "PRODUCER_OPT",
    "PROGRESS",
    "REQUEST_TIMEOUT",
    "VERSION",
    "Kind",
    "Progress",
    "Tool",
    "ToolError",
    "check_lookupds",
    "check_name",
    "check_nsqds",
    "check_one_source",
    "client_config",
    "flag",
    "run_tool",
    "user_agent",
]

_S, _I, _F, _B, _D, _L = Kind.STR, Kind.INT, Kind.FLOAT, Kind.BOOL, Kind.DURATION, Kind.STR_LIST


class ToolError(Exception):
    """A reason to stop that the operator can act on; printed as one line, exit 1."""


def flag(
    name: str,
    kind: Kind,
    default: object,
    help: str,
    metavar: str = "",
    default_text: str | None = None,
) -> FlagSpec:
    """A tool flag whose destination is its name with ``_`` (as NSQ's tools)."""
    return FlagSpec(
        name,
        kind,
        name.replace("-", "_"),
        default,
        help,
        metavar=metavar,
        default_text=default_text,
    )


# The flags several tools share, with the Go tools' wording and defaults.
VERSION = flag("version", _B, False, "print the version and exit")
NSQD_TCP = flag("nsqd-tcp-address", _L, [], "nsqd TCP address", "addr")
LOOKUPD_HTTP = flag("lookupd-http-address", _L, [], "lookupd HTTP address", "addr")
NSQD_HTTP = flag("nsqd-http-address", _L, [], "nsqd HTTP address", "addr")
CONSUMER_OPT = flag(
    "consumer-opt",
    _L,
    [],
    "option passed to the consumer, as go-nsq's: name,value (e.g. max_attempts,10)",
    "name,value",
)
PRODUCER_OPT = flag(
    "producer-opt", _L, [], "option passed to the producer, as go-nsq's: name,value", "name,value"
)
MAX_IN_FLIGHT = flag("max-in-flight", _I, 200, "max number of messages to allow in flight")
CONNECT_TIMEOUT = flag("http-client-connect-timeout", _D, 2.0, "timeout for HTTP connect")
REQUEST_TIMEOUT = flag("http-client-request-timeout", _D, 5.0, "timeout for HTTP request")
PROGRESS = flag(
    "progress-interval",
    _D,
    5.0,
    "[nsqx] print a progress line (count and rate) on stderr this often; 0: never",
)


@dataclass
class Tool:
    """One command-line tool: its name, Go name, flags, summary, examples and main."""

    name: str
    go_name: str
    flags: tuple[FlagSpec, ...]
    summary: str
    examples: str
    main: Callable[[dict[str, Any]], Awaitable[int]]

    @property
    def flagset(self) -> FlagSet:
        return FlagSet(f"nsqx {self.name}", self.flags, summary=self.summary, config_flag=None)

    def usage(self) -> str:
        return self.flagset.usage() + "\nExamples:\n" + self.examples.strip("\n") + "\n"


def run_tool(tool: Tool, argv: Sequence[str]) -> int:
    """Parse ``argv`` and run the tool; the exit status (0, 1 on errors, 2 on bad flags)."""
    prog = f"nsqx {tool.name}"
    try:
        parsed = tool.flagset.parse(argv)
    except HelpRequested:
        print(tool.usage())
        return 0
    except FlagError as err:
        print(f"{prog}: {err} (see `{prog} --help`)", file=sys.stderr)
        return 2
    if parsed.get("version", False):
        print(f"{tool.go_name} v{NSQ_VERSION} (nsqx {__version__})")
        return 0
    values = tool.flagset.resolve(parsed)
    opts = {**tool.flagset.defaults(), **values}
    try:
        # uvloop for this run only: no process-wide policy change (tests call this too)
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(_guarded(tool, opts))
    except ToolError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    except (ConfigError, NSQError, ValueError) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (tail | head): not an error worth a traceback
        with contextlib.suppress(OSError):
            sys.stdout = open("/dev/null", "w")  # noqa: SIM115 - silence the exit flush
        return 0
    except OSError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        return None
    return uvloop.new_event_loop


async def _guarded(tool: Tool, opts: dict[str, Any]) -> int:
    """Run ``main`` until it returns or SIGINT/SIGTERM asks to stop (then it is cancelled
    and may clean up in ``finally``)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(tool.main(opts))
    stopping = False

    def stop() -> None:
        nonlocal stopping
        stopping = True
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop)
    try:
        return await task
    except asyncio.CancelledError:
        if stopping:
            return 0
        raise


# -- checks -------------------------------------------------------------------------------


def check_name(kind: str, name: str, flag_name: str) -> None:
    """ToolError unless ``name`` is a legal topic or channel name."""
    if not is_valid_name(name):
        raise ToolError(
            f"--{flag_name}: {name!r} is not a valid {kind} name "
            "(1-64 characters of letters, digits, . _ -, optionally #ephemeral)"
        )


def check_one_source(opts: dict[str, Any], http: bool = False) -> None:
    """Exactly one of --nsqd-(tcp|http)-address and --lookupd-http-address, as Go's."""
    nsqd = "nsqd-http-address" if http else "nsqd-tcp-address"
    if not opts[nsqd.replace("-", "_")] and not opts["lookupd_http_address"]:
        raise ToolError(f"--{nsqd} or --lookupd-http-address required")
    if opts[nsqd.replace("-", "_")] and opts["lookupd_http_address"]:
        raise ToolError(f"use --{nsqd} or --lookupd-http-address not both")


async def check_nsqds(addresses: Iterable[str], timeout: float = 5.0) -> None:
    """ToolError naming the first nsqd TCP address that cannot be reached."""
    for address in addresses:
        try:
            host, port = split_address(address)
        except ValueError as err:
            raise ToolError(str(err)) from None
        try:
            async with asyncio.timeout(timeout):
                _, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError) as err:
            raise ToolError(f"cannot connect to nsqd at {address}: {_reason(err)}") from None
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def check_lookupds(addresses: Sequence[str], timeout: float = 5.0) -> None:
    """ToolError when no nsqlookupd answers ``/ping`` (the others are warned about)."""
    failures: list[str] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        for address in addresses:
            try:
                async with session.get(f"{http_base(address)}/ping") as resp:
                    await resp.read()
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
                failures.append(f"{address}: {_reason(err)}")
    if failures and len(failures) == len(addresses):
        raise ToolError("cannot reach nsqlookupd at " + "; ".join(failures))
    for failure in failures:
        print(f"warning: cannot reach nsqlookupd at {failure}", file=sys.stderr)


def _reason(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "timed out"
    if isinstance(err, aiohttp.ClientConnectorError):
        err = err.os_error
    if isinstance(err, OSError) and err.errno:
        return os.strerror(err.errno)
    return str(err) or type(err).__name__


# -- go-nsq options -----------------------------------------------------------------------

_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def user_agent(tool: str) -> str:
    """The user agent the tools send: the Go tool's name, then nsqx's."""
    return f"{tool}/{NSQ_VERSION} nsqx/{__version__}"


def client_config(opts: Iterable[str], flag_name: str, **base: Any) -> Config:
    """A client :class:`Config` from ``base`` plus go-nsq style ``name,value`` options.

    Names are go-nsq's (``max_attempts``, ``max_in_flight``, ``snappy``, ...); values
    are Go text (``true``, ``10``, ``1m30s``). ToolError for an unknown name or value.
    """
    values: dict[str, Any] = dict(base)
    for opt in opts:
        name, sep, text = opt.partition(",")
        name = name.strip().replace("-", "_")
        if not sep:
            # go-nsq: a bare name sets a boolean option to true
            text = "true"
        f = _FIELDS.get(name)
        if f is None:
            raise ToolError(f"--{flag_name}: unknown option {name!r}")
        try:
            values[name] = _convert(f.type, text)
        except ValueError as err:
            raise ToolError(f"--{flag_name}: {name}: {err}") from None
    try:
        return Config(**values)
    except ConfigError as err:
        raise ToolError(f"--{flag_name}: {err}") from None


def _convert(kind: Any, text: str) -> Any:
    kind = str(kind)
    if kind == "bool":
        return parse_go_bool(text)
    if kind == "int":
        return int(text)
    if kind == "float":
        return text  # Config parses numbers and Go durations itself
    return text


# -- progress -----------------------------------------------------------------------------


class Progress:
    """A count and its rate on stderr every ``interval`` seconds (0: never), and a summary.

    Lines look like ``nsqx pub: 12,345 messages (2,345/s)``; on a terminal they are
    rewritten in place.
    """

    def __init__(self, name: str, noun: str, interval: float, stream: TextIO | None = None) -> None:
        self.name = name
        self.noun = noun
        self.interval = interval
        self.stream = stream or sys.stderr
        self.count = 0
        self.started = time.monotonic()
        self._last = (self.started, 0)
        self._task: asyncio.Task[None] | None = None
        self._tty = self.stream.isatty()

    def add(self, n: int = 1) -> None:
        self.count += n

    def start(self) -> None:
        if self.interval > 0:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.report()

    def report(self) -> None:
        now = time.monotonic()
        then, count = self._last
        rate = (self.count - count) / (now - then) if now > then else 0.0
        self._last = (now, self.count)
        line = f"{self.name}: {self.count:,} {self.noun} ({rate:,.0f}/s)"
        if self._tty:
            self.stream.write("\r" + line + "   ")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    async def stop(self, summary: str = "") -> None:
        """Stop reporting; print ``summary`` (formatted with count, seconds, rate)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._tty and self.interval > 0:
            self.stream.write("\n")
        if summary:
            seconds = max(time.monotonic() - self.started, 1e-9)
            self.stream.write(
                summary.format(count=f"{self.count:,}", seconds=seconds, rate=self.count / seconds)
                + "\n"
            )
        self.stream.flush()
