"""The query parameters each state-changing endpoint of nsqd's HTTP API takes.

NSQ's nsqd ignores a parameter it does not know, so a misspelt one does nothing and
still answers 200: ``/topic/create?topic=x&ext=true`` makes a plain topic (the name is
``extend``), ``/mpub?defer=1000`` publishes at once. nsqx refuses such a request: a
``POST`` or ``PUT`` that names a parameter its endpoint does not take gets ``400
UNKNOWN_ARG_<NAME>`` (its text says what the endpoint takes) and changes nothing. Reads
(``GET``) are not checked, as in NSQ.

The sets are what the handlers read, and cover what NSQ 1.3's and Youzan's clients and
tools send (Go's nsqadmin and gnsq: ``topic``, ``channel``, ``defer``, ``binary``;
Youzan's nsqadmin adds ``partition`` to every topic and channel action; nsqx's
nsqlookupd sends the partition settings of ``/topic/create``). ``PUT /config/<option>``
takes none (its value is the body).
"""

from __future__ import annotations

from typing import Final

from nsqx.nsqd.channel_policy import SETTINGS

_TOPIC: Final = frozenset({"topic", "partition"})
_CHANNEL: Final = _TOPIC | {"channel"}

#: (method, path) -> the parameters it takes; ``/config/`` stands for every option
PARAMS: Final[dict[tuple[str, str], frozenset[str]]] = {
    ("POST", "/pub"): _TOPIC | {"defer"},
    ("POST", "/mpub"): _TOPIC | {"binary"},
    ("POST", "/topic/create"): _TOPIC
    | {
        # Youzan's partition settings (what nsqlookupd asks of each node it places a
        # partition on)
        "partition_num",
        "replicator",
        "orderedmulti",
        "extend",
        "multipart",
        "disable_channel_auto_create",
        "retention",
        "syncdisk",
        # nsqx's: when a publish of a replicated topic is answered
        "replication_ack",
    },
    ("POST", "/topic/delete"): _TOPIC,
    ("POST", "/topic/empty"): _TOPIC,
    ("POST", "/topic/pause"): _TOPIC,
    ("POST", "/topic/unpause"): _TOPIC,
    ("POST", "/channel/create"): _CHANNEL,
    ("POST", "/channel/delete"): _CHANNEL,
    ("POST", "/channel/empty"): _CHANNEL,
    ("POST", "/channel/pause"): _CHANNEL,
    ("POST", "/channel/unpause"): _CHANNEL,
    ("POST", "/channel/setoffset"): _CHANNEL | {"sequence"},
    ("POST", "/channel/setorder"): _CHANNEL | {"order"},
    ("POST", "/channel/config"): _CHANNEL | SETTINGS,
    ("POST", "/channel/deadletter/replay"): _CHANNEL | {"n"},
    ("POST", "/message/trace/enable"): frozenset({"topic", "channel"}),
    ("POST", "/message/trace/disable"): frozenset({"topic", "channel"}),
    ("POST", "/partition/role"): _TOPIC,
    ("POST", "/partition/fence"): _TOPIC | {"epoch"},
    ("POST", "/drain"): frozenset(),
    ("PUT", "/config/"): frozenset(),
}


def refusal(method: str, path: str, params: dict[str, list[str]]) -> str | None:
    """The 400 message for a request that names a parameter its endpoint does not take;
    None if it takes them all (or is a read, or no endpoint of the table)."""
    if not params:
        return None
    key = "/config/" if method == "PUT" and path.startswith("/config/") else path
    takes = PARAMS.get((method, key))
    if takes is None:
        return None
    for name in params:
        if name not in takes:
            known = ", ".join(sorted(takes)) or "none"
            return f"UNKNOWN_ARG_{name.upper()}: {path} takes no {name} (it takes {known})"
    return None
