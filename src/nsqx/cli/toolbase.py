"""What NSQ's small tools share: their flags, go-nsq's ``--consumer-opt``, errors, progress.

Each tool (``nsqx tail``, ``pub``, ``to-file``, ``to-http``, ``to-nsq``, ``stat``,
``bench``) is a module of :mod:`nsqx.cli` with a :class:`Tool`: its Go flags (as
:class:`~nsqx.cli.goflags.FlagSpec` rows), examples for ``--help``, and an async
``main``. :func:`run_tool` gives them one behaviour for what goes wrong: a bad flag is
one line and exit 2; a :class:`ToolError` (unreachable server, bad topic name, ...) is
one line and exit 1; Ctrl-C or SIGTERM stops the tool cleanly. No traceback reaches the
operator: the client library's warnings become the tool's own one-line messages, each
at most once per :data:`REPEAT_WINDOW` seconds (:class:`ToolLog`).

Every tool takes the secret of a cluster whose nsqd ask for AUTH (``--auth-http-address``)
or whose HTTP APIs ask for a bearer secret (``--http-auth``) the same way:
``--auth-secret``, ``--auth-secret-file`` or ``$NSQX_AUTH_SECRET`` (:func:`auth_secret`),
sent as nsqd's AUTH by the tool's consumers and producers (their ``auth_secret``, which
``--consumer-opt`` / ``--producer-opt`` may still set apart) and as ``Authorization:
Bearer`` on the tool's own calls to nsqd's and nsqlookupd's HTTP APIs
(:func:`bearer_headers`). A secret nsqd asks for and does not get, or refuses, stops the
tool with one line (:func:`check_nsqds` at the start, for the nsqd named or those
nsqlookupd lists; :class:`ToolLog` while it runs).

Progress is by time: :class:`Progress` prints the count and the rate over the last
interval every ``--progress-interval``; ``--status-every`` is Go's count-based line of
request latencies (:class:`StatusEvery`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlencode

import aiohttp

from nsqx import NSQ_VERSION, __version__
from nsqx.cli.goflags import FlagError, FlagSet, FlagSpec, HelpRequested, Kind, parse_go_bool
from nsqx.cli.version import version_line
from nsqx.client import Config, ConfigError, NSQError
from nsqx.client.conn import Connection, split_address
from nsqx.client.discovery import parse_lookup_result
from nsqx.client.errors import AuthError, ConnectionClosedError, HandshakeError
from nsqx.clusterinfo.info import http_base
from nsqx.clusterinfo.secret import ENV, load_secret
from nsqx.wire.names import is_valid_name

__all__ = [
    "AUTH_SECRET",
    "AUTH_SECRET_ENV",
    "AUTH_SECRET_FILE",
    "CONNECT_TIMEOUT",
    "CONSUMER_OPT",
    "LOOKUPD_HTTP",
    "MAX_IN_FLIGHT",
    "NSQD_HTTP",
    "NSQD_TCP",
    "PRODUCER_OPT",
    "PROGRESS",
    "REPEAT_WINDOW",
    "REQUEST_TIMEOUT",
    "VERSION",
    "Kind",
    "Progress",
    "StatusEvery",
    "Tool",
    "ToolError",
    "ToolLog",
    "auth_secret",
    "bearer_headers",
    "check_lookupds",
    "check_name",
    "check_nsqds",
    "check_one_source",
    "client_config",
    "flag",
    "one_line",
    "retrieve",
    "run_tool",
    "secret_hint",
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

#: where --auth-secret comes from when neither flag gives it
AUTH_SECRET_ENV = ENV
AUTH_SECRET = flag(
    "auth-secret",
    _S,
    "",
    "[nsqx] secret for nsqd's AUTH and, as `Authorization: Bearer`, for nsqd's and"
    f" nsqlookupd's HTTP APIs (--http-auth) (default: ${AUTH_SECRET_ENV})",
    "secret",
)
AUTH_SECRET_FILE = flag(
    "auth-secret-file", _S, "", "[nsqx] read --auth-secret from this file (its first line)", "path"
)


@dataclass
class Tool:
    """One command-line tool: its name, Go name, flags, summary, examples and main."""

    name: str
    #: the Go tool's name (``nsq_tail``), or nsqx's for a tool Go has not: in --version
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
        print(version_line(tool.go_name))
        return 0
    values = tool.flagset.resolve(parsed)
    opts = {**tool.flagset.defaults(), **values}
    tool_log = ToolLog(prog)
    tool_log.install()
    error = ""
    status = 1
    try:
        # uvloop for this run only: no process-wide policy change (tests call this too)
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            status = runner.run(_guarded(tool, opts, tool_log))
    except (ToolError, ConfigError, NSQError, ValueError) as err:
        error = str(err)
    except KeyboardInterrupt:
        status = 130
    except BrokenPipeError:
        # the reader went away (tail | head): nsqx's main ends quietly
        raise
    except OSError as err:
        error = str(err)
    finally:
        tool_log.uninstall()  # with the repeats it held back
    if error:
        # the reason to stop is the last line
        print(f"{prog}: {error}", file=sys.stderr)
        return 1
    return status


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        return None
    return uvloop.new_event_loop


async def _guarded(tool: Tool, opts: dict[str, Any], tool_log: ToolLog) -> int:
    """Run ``main`` until it returns or SIGINT/SIGTERM asks to stop (then it is cancelled
    and may clean up in ``finally``)."""
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(tool_log.loop_error)
    task = asyncio.ensure_future(tool.main(opts))
    stopping = False
    fatal: list[str] = []

    def stop() -> None:
        nonlocal stopping
        stopping = True
        task.cancel()

    def stop_with(reason: str) -> None:
        # a refusal that retrying cannot fix (a secret nsqd asks for, or refuses)
        if not fatal:
            fatal.append(reason)
            task.cancel()

    tool_log.fatal = stop_with
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop)
    try:
        return await task
    except asyncio.CancelledError:
        if fatal:
            raise ToolError(fatal[0]) from None
        if stopping:
            return 0
        raise
    finally:
        tool_log.fatal = None


# -- what the client library says --------------------------------------------------------

#: Seconds during which the same warning is printed once (the repeats are counted).
REPEAT_WINDOW = 10.0

# message ids (16 hex digits) make each "handler failed on message ..." different
_MESSAGE_ID = re.compile(r"\b[0-9a-f]{16}\b")


def one_line(err: BaseException) -> str:
    """An exception as one line of text: its own words for the errors the operator can
    act on, with its type for anything else."""
    if isinstance(err, (ToolError, NSQError, ConfigError)):
        text = str(err) or type(err).__name__
    elif isinstance(err, (OSError, TimeoutError)):
        text = _reason(err)
    else:
        text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return " ".join(text.split())


class ToolLog(logging.Handler):
    """The ``nsqx`` loggers' warnings (the client's "cannot connect", "handler failed
    on message ...") as the tool's own lines on stderr: ``nsqx pub: <message>``.

    Each is one line: an exception adds its type and text, never a traceback. The same
    line (message ids aside) is printed at most once per ``window`` seconds; the next
    one printed says how many were held back, and :meth:`uninstall` prints what is
    still held back.

    A line about an nsqd's refusal of the tool's secret that retrying cannot change (the
    client's :class:`AuthError` ``E_AUTH_REQUIRED`` or ``E_UNAUTHORIZED``) goes to
    ``fatal`` when one is set (the tool stops with it) instead of being printed.
    """

    def __init__(
        self,
        prog: str,
        window: float = REPEAT_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(logging.WARNING)
        self.prog = prog
        self.window = window
        self.clock = clock
        #: key -> [printed at, repeats held back since, the last repeat's text]
        self._seen: dict[str, list[Any]] = {}
        self._logger = logging.getLogger("nsqx")
        self._propagate = True
        #: called with the line of a refused secret (see above); None: printed as any
        self.fatal: Callable[[str], None] | None = None

    def install(self) -> None:
        self._propagate = self._logger.propagate
        self._logger.addHandler(self)
        self._logger.propagate = False

    def uninstall(self) -> None:
        self._logger.removeHandler(self)
        self._logger.propagate = self._propagate
        self.flush_repeats()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text = f"{text}: {one_line(record.exc_info[1])}"
            if self.fatal is not None and _auth_refusal(record) is not None:
                self.fatal(secret_hint(" ".join(text.split())))
                return
            self.say(text)
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)

    def loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The event loop's exception handler: asyncio's reports, in one line."""
        text = str(context.get("message") or "unexpected error in the event loop")
        exc = context.get("exception")
        self.say(f"{text}: {one_line(exc)}" if isinstance(exc, BaseException) else text)

    def say(self, text: str) -> None:
        """Print ``text`` unless the same line was printed less than a window ago."""
        text = " ".join(text.split())
        key = _MESSAGE_ID.sub("-", text)
        now = self.clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.window:
            seen[1] += 1
            seen[2] = text
            return
        if seen is not None and seen[1]:
            text += f" (and {seen[1]:,} more like it in the {now - seen[0]:.0f}s before)"
        elif len(self._seen) >= 1000:
            self._seen.pop(next(iter(self._seen)))  # the oldest: a bounded memory
        self._seen[key] = [now, 0, text]
        self._write(text)

    def flush_repeats(self) -> None:
        """Print the lines held back since their last printing, once each."""
        now = self.clock()
        for at, repeats, text in self._seen.values():
            if repeats:
                more = f" ({repeats:,} times in the last {now - at:.0f}s)" if repeats > 1 else ""
                self._write(text + more)
        self._seen.clear()

    def _write(self, text: str) -> None:
        stream = sys.stderr
        stream.write(f"{self.prog}: {text}\n")
        stream.flush()


#: nsqd's refusals of a secret that retrying cannot change: none given where one is
#: asked for, or one whose grants lack what it is used for. (E_AUTH_FAILED is not among
#: them: nsqd says it too when its auth server is down for a moment; the secret itself
#: was checked when the tool started.)
_FATAL_AUTH = frozenset({"E_AUTH_REQUIRED", "E_UNAUTHORIZED"})


def _auth_refusal(record: logging.LogRecord) -> AuthError | None:
    """The AuthError a log record reports (an argument, or its exception) when it is
    one retrying cannot change (:data:`_FATAL_AUTH`), else None."""
    found = list(record.args) if isinstance(record.args, tuple) else []
    if record.exc_info:
        found.append(record.exc_info[1])
    for item in found:
        if isinstance(item, AuthError) and item.code in _FATAL_AUTH:
            return item
    return None


def retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark ``fut``'s outcome as seen once it is done (a publish nobody awaits any more
    then fails quietly, without asyncio's "exception was never retrieved")."""
    fut.add_done_callback(_retrieved)


def _retrieved(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


# -- the secret ---------------------------------------------------------------------------


def auth_secret(opts: dict[str, Any]) -> str:
    """The tool's secret: the first line of ``--auth-secret-file``, else
    ``--auth-secret``, else ``$NSQX_AUTH_SECRET`` ("" for none). ToolError naming the
    flag when the file cannot give one, or when the secret cannot be a bearer token
    (printable ASCII, no spaces)."""
    try:
        return load_secret(
            opts.get("auth_secret") or "", opts.get("auth_secret_file") or "", "--auth-secret"
        )
    except ValueError as err:
        raise ToolError(str(err)) from None


def secret_hint(text: str) -> str:
    """``text``, with where to give a secret when it says one was asked for and missing
    (nsqd's E_AUTH_REQUIRED, an HTTP API's 401 AUTH_REQUIRED)."""
    return text + _SECRET_HINT if "AUTH_REQUIRED" in text else text


def bearer_headers(secret: str) -> dict[str, str]:
    """The header of the tool's HTTP calls to nsqd and nsqlookupd ({} without a secret)."""
    return {"Authorization": f"Bearer {secret}"} if secret else {}


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


async def check_nsqds(
    addresses: Iterable[str],
    timeout: float = 5.0,
    config: Config | None = None,
    secret_only: bool = False,
) -> None:
    """ToolError naming every nsqd TCP address that cannot be used.

    Each is connected to as the tool's clients will (``config``: IDENTIFY, TLS and
    compression as configured, and AUTH with its ``auth_secret`` when nsqd asks), all at
    once: an nsqd that accepts connections but does not answer (stopped, hung) is found
    here, within ``timeout``, rather than by the first publish; so is one that asks for
    a secret the tool has not, or refuses the one it has. ``secret_only`` (nsqd found
    through nsqlookupd, which the clients retry on their own): only the secret's
    failures count.
    """
    config = config or Config()
    targets: list[tuple[str, str, int]] = []
    for address in addresses:
        try:
            host, port = split_address(address)
        except ValueError as err:
            raise ToolError(str(err)) from None
        targets.append((address, host, port))
    found = await asyncio.gather(
        *(_probe(host, port, timeout, config) for _, host, port in targets)
    )
    failures = [
        f"{address}: {why}"
        for (address, _, _), (why, secret) in zip(targets, found, strict=True)
        if why and (secret or not secret_only)
    ]
    if failures:
        hint = _SECRET_HINT if any(_NEEDS_SECRET in f for f in failures) else ""
        raise ToolError("cannot connect to nsqd at " + "; ".join(failures) + hint)


#: what a probe says of an nsqd that asks for AUTH when the tool has no secret
_NEEDS_SECRET = "nsqd requires AUTH and no secret was given"
_SECRET_HINT = f" (give it with --auth-secret, --auth-secret-file or ${AUTH_SECRET_ENV})"


async def _probe(host: str, port: int, timeout: float, config: Config) -> tuple[str, bool]:
    """Why the nsqd at host:port cannot be used ("" when its handshake succeeds), and
    whether that is about the secret."""
    why = await _probe_reason(host, port, timeout, config)
    return why, why == _NEEDS_SECRET or why.startswith(_REFUSED)


#: how a probe's reason starts when nsqd refused the secret
_REFUSED = "the secret was refused: "


async def _probe_reason(host: str, port: int, timeout: float, config: Config) -> str:
    probe = dataclasses.replace(config, user_agent=user_agent("nsqx"), client_id="nsqx-check")
    conn = Connection(host, port, probe)
    try:
        async with asyncio.timeout(timeout):
            await conn.connect()
    except TimeoutError:
        if conn.transport is None:
            return "timed out"
        return f"no answer within {timeout:g}s (is nsqd stopped or hung?)"
    except AuthError as err:
        if err.code == "E_AUTH_REQUIRED":
            return _NEEDS_SECRET
        return f"{_REFUSED}{err.code} {_strip_key(err.description, conn)}"
    except ConnectionClosedError as err:
        if isinstance(err.__cause__, OSError):
            return _reason(err.__cause__)
        return "the connection was closed without an answer"
    except HandshakeError as err:
        if "b'HTTP/" in str(err):
            return "an HTTP server, not nsqd's TCP port"
        return _strip_key(str(err), conn)
    except (NSQError, OSError) as err:
        return _strip_key(one_line(err), conn)
    finally:
        conn.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(conn.wait_closed(), 1.0)
    return ""


def _strip_key(text: str, conn: Connection) -> str:
    # the client's messages start with the address, which the caller names already
    return text.removeprefix(f"{conn.key}: ")


async def check_lookupds(
    addresses: Sequence[str],
    timeout: float = 5.0,
    secret: str = "",
    topics: Sequence[str] = (),
) -> list[str]:
    """ToolError when no nsqlookupd answers ``/ping`` (the others are warned about), or
    when one refuses to tell where ``topics`` are (``/lookup``; without topics its
    ``/topics``) for want of the tool's secret (``--http-auth``: 401 or 403). The TCP
    addresses of the nsqd they list for ``topics`` (for :func:`check_nsqds`)."""
    failures: list[str] = []
    refusals: list[str] = []
    nsqds: dict[str, None] = {}
    reads = [f"/lookup?{urlencode({'topic': t})}" for t in topics] or ["/topics"]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        for address in addresses:
            base = http_base(address)
            try:
                async with session.get(f"{base}/ping") as resp:
                    await resp.read()
                for read in reads:
                    async with session.get(f"{base}{read}", headers=bearer_headers(secret)) as resp:
                        body = await resp.read()
                    if resp.status in (401, 403):
                        refusals.append(f"{address}: {resp.status} {_message_of(body)}")
                        break
                    if resp.status == 200 and read.startswith("/lookup"):
                        nsqds.update(dict.fromkeys(_listed_nsqds(body)))
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
                failures.append(f"{address}: {_reason(err)}")
    if refusals:
        hint = "" if secret else _SECRET_HINT
        raise ToolError("nsqlookupd refused the tool's requests: " + "; ".join(refusals) + hint)
    if failures and len(failures) == len(addresses):
        raise ToolError("cannot reach nsqlookupd at " + "; ".join(failures))
    for failure in failures:
        print(f"warning: cannot reach nsqlookupd at {failure}", file=sys.stderr)
    return list(nsqds)


def _listed_nsqds(body: bytes) -> list[str]:
    """The TCP addresses of the nsqd in a /lookup answer (none when it is no JSON)."""
    try:
        found = parse_lookup_result(json.loads(body))
    except (ValueError, TypeError, AttributeError):
        return []
    return sorted(set(found.producers) | set(found.partitions.values()))


def _message_of(body: bytes) -> str:
    """NSQ's ``{"message": ...}`` of an HTTP answer, else its text, in one short line."""
    text = body.decode("utf-8", "replace")
    with contextlib.suppress(ValueError):
        decoded = json.loads(text)
        if isinstance(decoded, dict) and "message" in decoded:
            text = str(decoded["message"])
    return " ".join(text.split())[:200]


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


def client_config(opts: Iterable[str], flag_name: str, secret: str = "", **base: Any) -> Config:
    """A client :class:`Config` from ``base`` plus go-nsq style ``name,value`` options.

    Names are go-nsq's (``max_attempts``, ``max_in_flight``, ``snappy``, ...); values
    are Go text (``true``, ``10``, ``1m30s``). ToolError for an unknown name or value.
    ``secret`` (the tool's :func:`auth_secret`) is the ``auth_secret``, unless an
    option names one of its own (``auth_secret,...``: a relay's two clusters may differ).
    """
    values: dict[str, Any] = dict(base)
    if secret:
        values["auth_secret"] = secret
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

    Lines look like ``nsqx pub: 12,345 published (2,345/s)``: the rate is over the time
    since the previous line (a real window, never a burst of a few messages). The count
    is what :meth:`add` added, or what ``counter`` returns when given. ``detail`` adds
    to each line what it returns (when anything). On a terminal lines are rewritten in
    place.
    """

    def __init__(
        self,
        name: str,
        noun: str,
        interval: float,
        stream: TextIO | None = None,
        detail: Callable[[], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        counter: Callable[[], int] | None = None,
    ) -> None:
        self.name = name
        self.noun = noun
        self.interval = interval
        self.stream = stream or sys.stderr
        self.detail = detail
        self.clock = clock
        self._count = 0
        self._counter = counter
        self.started = clock()
        self._last = (self.started, 0)
        self._task: asyncio.Task[None] | None = None
        self._tty = self.stream.isatty()

    @property
    def count(self) -> int:
        """What was counted: by :meth:`add`, or what ``counter`` says."""
        return self._counter() if self._counter is not None else self._count

    def add(self, n: int = 1) -> None:
        self._count += n

    def start(self) -> None:
        if self.interval > 0:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            # never sooner: each line's rate is over at least one interval
            await asyncio.sleep(self.interval)
            self.report()

    def report(self) -> None:
        """Print the line: the count and its rate since the previous line."""
        now = self.clock()
        then, count = self._last
        total = self.count
        rate = (total - count) / (now - then) if now > then else 0.0
        self._last = (now, total)
        line = f"{self.name}: {total:,} {self.noun} ({rate:,.0f}/s)"
        extra = self.detail() if self.detail is not None else ""
        if extra:
            line += f"; {extra}"
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
            seconds = max(self.clock() - self.started, 1e-9)
            count = self.count
            self.stream.write(
                summary.format(count=f"{count:,}", seconds=seconds, rate=count / seconds) + "\n"
            )
        self.stream.flush()


class StatusEvery:
    """Go's ``--status-every`` (its ``timer_metrics``): after every ``every`` requests,
    a line with their latencies on stderr::

        nsqx to-nsq: [127.0.0.1:4150]: finished 250 - 99th: 1.21ms - 95th: 0.93ms - avg: 0.41ms

    It counts requests, not time, as NSQ's tools do; the rate is :class:`Progress`'s.
    """

    def __init__(self, name: str, prefix: str, every: int, stream: TextIO | None = None) -> None:
        self.name = name
        self.prefix = prefix
        self.every = every
        self.stream = stream
        self.timings: list[float] = []

    def record(self, seconds: float) -> None:
        if self.every <= 0:
            return
        self.timings.append(seconds)
        if len(self.timings) < self.every:
            return
        timings = sorted(self.timings)
        self.timings.clear()
        avg = sum(timings) / len(timings)
        stream = self.stream or sys.stderr
        stream.write(
            f"{self.name}: {self.prefix}: finished {len(timings)} - "
            f"99th: {_percentile(99.0, timings) * 1000:.2f}ms - "
            f"95th: {_percentile(95.0, timings) * 1000:.2f}ms - avg: {avg * 1000:.2f}ms\n"
        )
        stream.flush()


def _percentile(perc: float, ordered: Sequence[float]) -> float:
    """Go's timer_metrics percentile of sorted ``ordered``."""
    if not ordered:
        return 0.0
    index = math.ceil(perc / 100.0 * len(ordered) + 0.5)
    return ordered[min(index, len(ordered) - 1)]
