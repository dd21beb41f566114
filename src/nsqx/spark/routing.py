"""Where the sink's rows go, and where ``mode=channel`` subscribes.

A topic's partitions and the nsqd that leads each are found as nsqx.client's
PartitionProducer finds them, through nsqlookupd (``/lookup?access=w&metainfo=true``), or
by asking each nsqd named by its HTTP address (``/stats`` lists the partitions it hosts
and whether it leads them, ``/info`` its TCP port). The sink then publishes a row with a
``partition`` to that partition, one with a ``key`` to ``partition_for_key(key,
partition_num)`` (youzan/go-nsq's function, as nsqx.client), and a row's ``headers`` as
the JSON ext header of an MPUB_EXT. Rows with none of these go where the plain sink puts
them: the task's nsqd, no partition named.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from nsqx.client.discovery import parse_lookup_result
from nsqx.client.sharding import partition_for_key
from nsqx.client.youzan import ext_header
from nsqx.spark import rangeclient
from nsqx.spark.options import NsqOptionError, NsqOptions
from nsqx.spark.publisher import MAX_BATCH_BYTES, BlockingPublisher, PublishError
from nsqx.wire import commands as cmd

#: the columns that route a row (Kafka's sink names them so too), by lower-cased name
KEY_COLUMN = "key"
PARTITION_COLUMN = "partition"
HEADERS_COLUMN = "headers"


class NsqColumnError(ValueError):
    """A routing column of the written rows has a type or a value the sink cannot use
    (the message names the column, and the value)."""


# -- the columns, checked on the driver -------------------------------------------------


@dataclass(frozen=True)
class SinkColumns:
    """The routing columns a written DataFrame has (their names as spelled there)."""

    key: str | None = None
    partition: str | None = None
    headers: str | None = None
    #: how ``headers`` is typed: "array" (Kafka's ARRAY<STRUCT<key, value>>) or "map"
    headers_kind: str = ""

    @property
    def any(self) -> bool:
        return bool(self.key or self.partition or self.headers)


def sink_columns(schema: Any, opts: NsqOptions) -> SinkColumns:
    """The routing columns of ``schema`` (a StructType), their types checked: ``key``
    string or binary, ``partition`` an integer, ``headers`` ARRAY<STRUCT<key STRING,
    value BINARY or STRING>> or MAP<STRING, STRING or BINARY>. Raises NsqColumnError
    naming the column; NsqOptionError when the options cannot find partitions."""
    from pyspark.sql import types as T

    fields = {f.name.lower(): f for f in schema.fields}
    found: dict[str, str] = {}
    if KEY_COLUMN in fields:
        f = fields[KEY_COLUMN]
        if not isinstance(f.dataType, T.StringType | T.BinaryType):
            raise NsqColumnError(
                f"nsq: column {f.name} routes rows by key: it must be a string or binary, "
                f"not {f.dataType.simpleString()}"
            )
        found["key"] = f.name
    if PARTITION_COLUMN in fields:
        f = fields[PARTITION_COLUMN]
        if not isinstance(f.dataType, T.IntegerType | T.LongType | T.ShortType | T.ByteType):
            raise NsqColumnError(
                f"nsq: column {f.name} names each row's partition: it must be an integer, "
                f"not {f.dataType.simpleString()}"
            )
        found["partition"] = f.name
    kind = ""
    if HEADERS_COLUMN in fields:
        f = fields[HEADERS_COLUMN]
        kind = _headers_kind(f.dataType)
        if not kind:
            raise NsqColumnError(
                f"nsq: column {f.name} holds each row's headers: it must be "
                "ARRAY<STRUCT<key: STRING, value: BINARY>> (Kafka's, what includeHeaders "
                "reads; value may be STRING) or MAP<STRING, STRING> (or BINARY values), "
                f"not {f.dataType.simpleString()}"
            )
        found["headers"] = f.name
    cols = SinkColumns(found.get("key"), found.get("partition"), found.get("headers"), kind)
    if (cols.key or cols.partition) and not (opts.lookupd_http or opts.nsqd_http):
        raise NsqOptionError(
            f"nsq: column {cols.partition or cols.key} routes rows to a topic's partitions, "
            "which the sink finds through lookupdHttpAddresses or nsqdHttpAddresses: give "
            "one of them (or drop the column)"
        )
    return cols


def _headers_kind(t: Any) -> str:
    from pyspark.sql import types as T

    text_or_bytes = (T.StringType, T.BinaryType)
    if isinstance(t, T.ArrayType) and isinstance(t.elementType, T.StructType):
        names = {f.name.lower(): f.dataType for f in t.elementType.fields}
        if (
            len(names) == 2
            and isinstance(names.get("key"), T.StringType)
            and isinstance(names.get("value"), text_or_bytes)
        ):
            return "array"
    if (
        isinstance(t, T.MapType)
        and isinstance(t.keyType, T.StringType)
        and isinstance(t.valueType, text_or_bytes)
    ):
        return "map"
    return ""


# -- headers -----------------------------------------------------------------------------


def header_json(value: Any, kind: str) -> bytes | None:
    """A row's headers as the JSON ext header of a PUB_EXT (None: no header, for null
    or empty headers). Values are text in JSON: binary ones must be UTF-8 (what
    includeHeaders reads is); a null value is JSON null. Keys must differ, and the keys
    starting with ``##`` are nsqd's (``##client_dispatch_tag``, ``##trace_id`` only).
    Raises NsqColumnError."""
    if value is None:
        return None
    pairs: Iterator[tuple[Any, Any]]
    if kind == "map":
        pairs = iter(value.items())
    else:
        pairs = ((h["key"], h["value"]) for h in value if h is not None)
    header: dict[str, str | None] = {}
    for k, v in pairs:
        if k is None:
            raise NsqColumnError("nsq: a header key is null")
        if k in header:
            raise NsqColumnError(
                f"nsq: header {k!r} appears twice in a row (a JSON ext header has one value "
                "per key)"
            )
        if isinstance(v, bytes | bytearray | memoryview):
            try:
                v = bytes(v).decode()
            except UnicodeDecodeError:
                raise NsqColumnError(
                    f"nsq: the value of header {k!r} is not UTF-8 text (a JSON ext header "
                    f"holds text): {bytes(v)[:40]!r}"
                ) from None
        header[k] = v
    if not header:
        return None
    try:
        return ext_header(header)
    except (ValueError, TypeError) as err:
        raise NsqColumnError(f"nsq: a row's headers (keys {sorted(header)}): {err}") from None


# -- where a topic's partitions are ------------------------------------------------------


def _unwrap(data: Any) -> Any:
    # NSQ's V1 envelope, where a server adds it
    return data["data"] if isinstance(data, dict) and isinstance(data.get("data"), dict) else data


def nsqd_tcp_address(http_address: str) -> str:
    """The TCP address of the nsqd at ``http_address``: the same host, the TCP port
    its ``/info`` tells."""
    info = _unwrap(json.loads(rangeclient.request(http_address, "GET", "/info", {})))
    try:
        port = int(info["tcp_port"])
    except (KeyError, TypeError, ValueError):
        raise rangeclient.NsqHttpError(
            f"GET http://{http_address}/info: no tcp_port in {info!r}"
        ) from None
    return f"{http_address.rpartition(':')[0]}:{port}"


@dataclass(frozen=True)
class NodeTopic:
    """What one nsqd (asked over HTTP) has of a topic."""

    tcp: str
    #: the partitions of the topic this nsqd hosts and leads; None when it has the
    #: topic as NSQ 1.3 has it (no partitions), or not at all
    leads: tuple[int, ...] | None
    partition_num: int = 1
    #: an ext topic; None when this nsqd has not the topic
    ext: bool | None = None
    ordered: bool = False


def node_topic(http_address: str, topic: str) -> NodeTopic:
    """Ask the nsqd at ``http_address`` for its TCP port and its partitions of
    ``topic`` (its /stats: one entry per local partition, with Youzan's fields)."""
    tcp = nsqd_tcp_address(http_address)
    params = {"format": "json", "topic": topic, "include_clients": "false", "include_mem": "false"}
    data = _unwrap(json.loads(rangeclient.request(http_address, "GET", "/stats", params)))
    entries = [
        t
        for t in data.get("topics") or ()
        if t.get("topic_name") == topic and t.get("topic_partition") is not None
    ]
    if not entries:
        # listed without Youzan's fields: a topic as NSQ 1.3 has it (nsqx's nsqd lists
        # every ext topic with them), which takes no ext header
        listed = any(t.get("topic_name") == topic for t in data.get("topics") or ())
        return NodeTopic(tcp, None, ext=False if listed else None)
    return NodeTopic(
        tcp,
        tuple(sorted(int(t["topic_partition"]) for t in entries if t.get("is_leader", True))),
        max(int(t.get("partition_num") or 1) for t in entries),
        any(bool(t.get("is_ext")) for t in entries),
        any(bool(t.get("is_multi_ordered")) for t in entries),
    )


@dataclass(frozen=True)
class Route:
    """A topic's partitions as found: the nsqd (TCP address) leading each; none for a
    topic without partitions (NSQ 1.3's, or not created yet)."""

    topic: str
    partition_num: int = 1
    leaders: Mapping[int, str] = field(default_factory=dict)
    #: an ext topic (None: not known yet, e.g. nsqlookupd's meta does not say so, or a
    #: topic without partitions: see ``nodes_http``)
    ext: bool | None = None
    ordered: bool = False
    #: the HTTP addresses of nsqd that have the topic, as nsqlookupd lists them: asked
    #: (their /stats) whether it is an ext topic when a row with headers needs to know
    nodes_http: tuple[str, ...] = ()


def find_route(opts: NsqOptions, topic: str) -> Route:
    """The partitions of ``topic`` and their leaders, from every nsqlookupd of
    ``lookupdHttpAddresses`` (the first to name a partition's leader wins) and every
    nsqd of ``nsqdHttpAddresses``. An nsqlookupd that cannot be reached is skipped if
    another answers; an nsqd that cannot be reached fails the task (Spark retries it)."""
    leaders: dict[int, str] = {}
    num = 0
    ext: bool | None = None
    ordered = False
    failures: list[rangeclient.NsqHttpError] = []
    answered = False
    nodes_http: dict[str, None] = {}  # (ordered, each once)
    for lookupd in opts.lookupd_http:
        try:
            body = rangeclient.request(
                lookupd, "GET", "/lookup", {"topic": topic, "access": "w", "metainfo": "true"}
            )
        except rangeclient.NsqHttpError as err:
            if " 404 " in str(err):  # NSQ 1.3's lookupd: an unknown topic
                answered = True
            else:
                failures.append(err)
            continue
        try:
            decoded = json.loads(body)
            result = parse_lookup_result(decoded)
        except ValueError as err:
            failures.append(rangeclient.NsqHttpError(f"nsqlookupd {lookupd}: {err}"))
            continue
        answered = True
        nodes_http.update(dict.fromkeys(_lookup_http_addresses(decoded)))
        for pid, address in result.partitions.items():
            leaders.setdefault(pid, address)
        if result.partitions:
            num = max(num, result.partition_num)
            # (only a "yes" is trusted: for partitions made on nsqd directly, nsqlookupd
            # derives a meta from their registrations, without their settings)
            if result.meta is not None and result.meta.ext:
                ext = True
            ordered = ordered or bool(result.meta and result.meta.ordered)
    if failures and not answered:
        raise failures[0]
    nodes_http.update(dict.fromkeys(opts.nsqd_http))
    for address in opts.nsqd_http:
        node = node_topic(address, topic)
        if node.leads is None:
            continue
        for pid in node.leads:
            leaders.setdefault(pid, node.tcp)
        num = max(num, node.partition_num)
        ext = bool(ext or node.ext)
        ordered = ordered or node.ordered
    if not leaders:
        return Route(topic, nodes_http=tuple(nodes_http))
    return Route(topic, max(num, max(leaders) + 1), leaders, ext, ordered, tuple(nodes_http))


def _lookup_http_addresses(body: Any) -> list[str]:
    """``host:http_port`` of the nsqd in a /lookup answer: its partitions' leaders, else
    its producers (NSQ 1.3's nsqlookupd has no partitions)."""
    data = _unwrap(body)
    if not isinstance(data, dict):
        return []
    parts = data.get("partitions")
    peers = list(parts.values()) if isinstance(parts, dict) and parts else []
    peers = peers or list(data.get("producers") or [])
    found = []
    for peer in peers:
        if not isinstance(peer, dict):
            continue
        host, port = peer.get("broadcast_address"), peer.get("http_port")
        if isinstance(host, str) and host and isinstance(port, int):
            found.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return found


def learn_ext(route: Route) -> Route:
    """``route`` with ``ext`` known when the nsqd that have the topic say (their
    /stats: ``is_ext``); as it was when none can (NSQ 1.3's nsqd, or the topic is on
    none yet). Raises rangeclient.NsqHttpError when one cannot be reached."""
    if route.ext is not None:
        return route
    for address in route.nodes_http:
        node = node_topic(address, route.topic)
        if node.ext is not None:
            return replace(route, ext=node.ext)
    return route


def plain_addresses(opts: NsqOptions) -> list[str]:
    """The nsqd (TCP addresses) the plain sink spreads its tasks over: those named, or
    else those of nsqdHttpAddresses, or else the producers nsqlookupd lists."""
    if opts.nsqd_tcp:
        return list(opts.nsqd_tcp)
    if opts.nsqd_http:
        return [nsqd_tcp_address(a) for a in opts.nsqd_http]
    return [
        f"{p['broadcast_address']}:{p['tcp_port']}"
        for lookupd in opts.lookupd_http
        for p in rangeclient.lookup(lookupd, opts.topic or "")
    ]


# -- publishing routed rows ----------------------------------------------------------------


class _Lane:
    """The batch being filled for one (topic, partition): all plain or all with an
    ext header, so each is one MPUB or one MPUB_EXT."""

    __slots__ = ("address", "bodies", "ext", "headers", "partition", "size", "topic")

    def __init__(self, topic: str, partition: int | None, address: str) -> None:
        self.topic = topic
        self.partition = partition
        self.address = address
        self.bodies: list[bytes] = []
        self.headers: list[bytes] = []
        self.ext = False
        self.size = 0


class RoutedPublisher:
    """Publishes rows by partition (``partition``, else ``key``) with their headers:
    one batch per (topic, partition) being filled, sent (pipelined, one connection per
    nsqd) when full, when a row of the other kind (with or without headers) comes, or at
    the end; so the rows of one key keep their order."""

    def __init__(self, opts: NsqOptions, cols: SinkColumns, task_index: int) -> None:
        self.opts = opts
        self.cols = cols
        self.task_index = task_index
        self._routes: dict[str, Route] = {}
        self._lanes: dict[tuple[str, int | None], _Lane] = {}
        self._publishers: dict[str, BlockingPublisher] = {}
        self._default: str | None = None

    def route(self, topic: str) -> Route:
        route = self._routes.get(topic)
        if route is None:
            if self.opts.lookupd_http or self.opts.nsqd_http:
                route = find_route(self.opts, topic)
            else:
                route = Route(topic)  # nsqdTcpAddresses alone: nothing to ask
            self._routes[topic] = route
        return route

    def partition_of(self, route: Route, partition: Any, key: Any) -> int | None:
        """The partition a row goes to (None: none named, the nsqd's default)."""
        if partition is not None:
            n = route.partition_num
            if isinstance(partition, bool) or not isinstance(partition, int):
                raise NsqColumnError(f"nsq: partition {partition!r} is not an integer")
            if not 0 <= partition < n:
                raise NsqColumnError(
                    f"nsq: a row's partition {partition} is out of range: topic "
                    f"{route.topic!r} has {n} partition{'s' if n != 1 else ''} (0-{n - 1})"
                )
            return partition if route.leaders else None
        if key is not None and route.leaders:
            if not isinstance(key, str | bytes | bytearray | memoryview):
                raise NsqColumnError(f"nsq: key {key!r} is not a string or binary")
            return partition_for_key(key, route.partition_num)
        if route.ordered:
            raise NsqColumnError(
                f"nsq: topic {route.topic!r} is ordered: each row needs a key or a "
                "partition (a null one cannot be published)"
            )
        return None

    def _default_address(self) -> str:
        if self._default is None:
            addresses = plain_addresses(self.opts)
            if not addresses:
                raise RuntimeError(
                    "nsq: no nsqd to publish to (nsqdTcpAddresses / nsqdHttpAddresses / "
                    "lookupdHttpAddresses)"
                )
            self._default = addresses[self.task_index % len(addresses)]
        return self._default

    def _lane(self, route: Route, pid: int | None) -> _Lane:
        lane = self._lanes.get((route.topic, pid))
        if lane is None:
            if pid is None:
                address = self._default_address()
            else:
                found = route.leaders.get(pid)
                if found is None:
                    raise PublishError(
                        f"nsq: no nsqd leads partition {pid} of topic {route.topic!r} now "
                        f"(found: {sorted(route.leaders)} of {route.partition_num})"
                    )
                address = found
            lane = self._lanes[route.topic, pid] = _Lane(route.topic, pid, address)
        return lane

    def add(self, topic: str, body: bytes, row: Any) -> None:
        """Route one row (its body already taken out)."""
        cols = self.cols
        header = header_json(row[cols.headers], cols.headers_kind) if cols.headers else None
        pid: int | None = None
        if cols.key or cols.partition or header is not None:
            route = self.route(topic)
            pid = self.partition_of(
                route,
                row[cols.partition] if cols.partition else None,
                row[cols.key] if cols.key else None,
            )
            if header is not None and route.ext is None and route.nodes_http:
                # nsqlookupd's meta does not say (it is derived for a topic made on an
                # nsqd directly): ask the nsqd, before anything with headers is sent
                route = self._routes[topic] = learn_ext(route)
            if header is not None and route.ext is False:
                raise NsqColumnError(
                    f"nsq: topic {topic!r} is not an ext topic: a row's headers need a "
                    "topic created with extend=true (its JSON ext headers)"
                )
        else:
            route = self._routes.get(topic) or Route(topic)
        lane = self._lane(route, pid)
        ext = header is not None
        more = len(body) + 4 + (len(header) + 2 if header is not None else 0)
        if lane.bodies and (
            lane.ext != ext
            or len(lane.bodies) >= self.opts.batch_size
            or lane.size + more > MAX_BATCH_BYTES
        ):
            self._send(lane)
        lane.ext = ext
        lane.bodies.append(body)
        if header is not None:
            lane.headers.append(header)
        lane.size += more

    def _send(self, lane: _Lane) -> None:
        pub = self._publishers.get(lane.address)
        if pub is None:
            pub = self._publishers[lane.address] = BlockingPublisher(lane.address)
        if lane.ext:
            command = cmd.mpub_ext(lane.topic, lane.partition, lane.headers, lane.bodies)
        else:
            command = cmd.mpub(lane.topic, lane.bodies, lane.partition)
        where = "" if lane.partition is None else f" partition {lane.partition}"
        what = f"topic {lane.topic!r}{where}{', with headers' if lane.ext else ''}"
        pub.send(command, what)
        lane.bodies, lane.headers, lane.size = [], [], 0

    def finish(self) -> None:
        """Send what is left and wait until nsqd acknowledged every batch."""
        for lane in self._lanes.values():
            if lane.bodies:
                self._send(lane)
        for pub in self._publishers.values():
            pub.flush()

    def close(self) -> None:
        for pub in self._publishers.values():
            pub.close()


def publish_routed(
    opts: NsqOptions, cols: SinkColumns, rows: Iterator[Any], task_index: int
) -> tuple[int, int]:
    """Publish ``rows`` by their routing columns; (messages, body bytes) published.
    Raises PublishError (a refusal names the batch's topic and partition; an ext
    header on a topic that is not an ext topic says so) or NsqColumnError."""
    out = RoutedPublisher(opts, cols, task_index)
    count = size = 0
    body_column, topic_column = opts.body_column, opts.topic_column
    try:
        for row in rows:
            body = row[body_column]
            if body is None:
                raise ValueError(f"nsq: column {body_column} is null; messages need a body")
            if isinstance(body, str):
                body = body.encode()
            topic = str(row[topic_column]) if topic_column else opts.topic
            assert topic is not None
            out.add(topic, bytes(body), row)
            count += 1
            size += len(body)
        out.finish()
    except PublishError as err:
        if "E_EXT_NOT_SUPPORT" in str(err):
            raise PublishError(
                f"{err}: a row's headers need an ext topic (created with extend=true)"
            ) from err
        raise
    finally:
        out.close()
    return count, size
