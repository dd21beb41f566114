"""A channel's delivery policy: dead letters, message time-to-live, delivery rate limits.

None of these exist in NSQ 1.3 (nsq #974, #302, Youzan's KB/s limit); each is off until
set on a channel with ``POST /channel/config`` (docs/dead-letters.md). The policy is
persisted in nsqd.dat beside the channel's paused state, and read by the channel's
pump: a channel with the default policy pays one attribute test per batch for it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Final

from nsqx.wire.names import is_ephemeral, is_valid_name

#: how a dead letter is written to its topic: a JSON envelope any NSQ client can read,
#: or the original body with the facts in its ext header (an ``extend`` topic)
FORMAT_JSON: Final = "json"
FORMAT_EXT: Final = "ext"
DEAD_LETTER_FORMATS: Final = (FORMAT_JSON, FORMAT_EXT)

#: what a channel at its maximum depth does: publishes to its topic are refused until
#: it has room, or its oldest messages are dropped (counted)
OVERFLOW_REFUSE: Final = "refuse"
OVERFLOW_DROP: Final = "drop_oldest"
OVERFLOWS: Final = (OVERFLOW_REFUSE, OVERFLOW_DROP)

#: the dead-letter topic when none is named: ``<topic>.dead``
DEAD_SUFFIX: Final = ".dead"

#: bounds of the settings (a channel config outside them is refused)
MAX_ATTEMPTS_LIMIT: Final = 65535  # attempts are a u16 on the wire
MAX_TTL_MS: Final = 10 * 365 * 86400 * 1000


#: how far a channel's replays have looked in one partition of a dead-letter topic: the
#: next sequence to look at, and the publish time (ns) of the record before it, by which
#: a topic deleted and made again is told from the one the mark was made in (0: not known)
ReplayMark = tuple[int, int]


def mark_key(topic: str, partition: int) -> str:
    """The key of a channel's replay mark in one partition of a dead-letter topic."""
    return f"{topic}:{partition}"


def parse_mark_key(key: str) -> tuple[str, int]:
    """(topic, partition) of a replay mark's key ((key, -1) if it is not one)."""
    topic, _, pid = key.rpartition(":")
    return (topic, int(pid)) if topic and pid.isascii() and pid.isdigit() else (key, -1)


class PolicyError(ValueError):
    """A setting that cannot be: its message is the HTTP error (``INVALID_<NAME>``...)."""


@dataclass(frozen=True)
class ChannelPolicy:
    """What a channel does beyond NSQ's at-least-once delivery (all off by default)."""

    #: deliveries before a message goes to the dead-letter topic instead (0: never)
    max_attempts: int = 0
    #: where dead letters go ("": ``<topic>.dead``)
    dead_letter_topic: str = ""
    #: FORMAT_JSON or FORMAT_EXT
    dead_letter_format: str = FORMAT_JSON
    #: messages published longer ago than this are skipped and counted, never
    #: delivered (0: no limit)
    message_ttl_ms: int = 0
    #: deliveries per second to the channel's consumers together (0: no limit)
    max_msgs_per_sec: int = 0
    #: message frame bytes per second delivered (0: no limit)
    max_bytes_per_sec: int = 0
    #: the most messages waiting (its depth), and the most bytes of the log from its
    #: cursor on (0: no limit); what happens then: ``overflow``
    max_depth: int = 0
    max_depth_bytes: int = 0
    overflow: str = OVERFLOW_REFUSE

    @property
    def active(self) -> bool:
        """Anything set (the pump looks no further when not)."""
        return self != NO_POLICY

    @property
    def rate_limited(self) -> bool:
        return bool(self.max_msgs_per_sec or self.max_bytes_per_sec)

    @property
    def bounded(self) -> bool:
        """A maximum depth (in messages or bytes) is set."""
        return bool(self.max_depth or self.max_depth_bytes)

    @property
    def refuses(self) -> bool:
        """A full channel refuses its topic's publishes."""
        return self.bounded and self.overflow == OVERFLOW_REFUSE

    def dead_letter_topic_for(self, topic: str) -> str:
        """The dead-letter topic of a channel of ``topic``."""
        return self.dead_letter_topic or topic + DEAD_SUFFIX

    def to_json(self) -> dict[str, Any]:
        """Every setting (the GET /channel/config answer)."""
        return asdict(self)

    def changed_json(self) -> dict[str, Any]:
        """The settings that differ from the default (what nsqd.dat keeps)."""
        return {k: v for k, v in asdict(self).items() if v != getattr(NO_POLICY, k)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ChannelPolicy:
        """From nsqd.dat; unknown keys are ignored (a newer nsqx wrote them)."""
        return NO_POLICY.updated({k: str(v) for k, v in doc.items() if k in SETTINGS})

    def updated(self, values: dict[str, str]) -> ChannelPolicy:
        """This policy with ``values`` (as given over HTTP: text; "" sets a setting back
        to its default). Raises PolicyError."""
        changes: dict[str, Any] = {}
        for key, text in values.items():
            if key not in SETTINGS:
                raise PolicyError(f"UNKNOWN_ARG_{key.upper()}")
            default = getattr(NO_POLICY, key)
            if text == "":
                changes[key] = default
            elif isinstance(default, int):
                if not (text.isascii() and text.isdigit()) or len(text) > 18:
                    raise PolicyError(f"INVALID_{key.upper()}")
                changes[key] = int(text)
            else:
                changes[key] = text
        policy = replace(self, **changes)
        policy.check()
        return policy

    def check(self) -> None:
        """Raise PolicyError if a setting is out of its bounds."""
        if not 0 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise PolicyError("INVALID_MAX_ATTEMPTS")
        if self.dead_letter_topic and not is_valid_name(self.dead_letter_topic):
            raise PolicyError("INVALID_DEAD_LETTER_TOPIC")
        if self.dead_letter_format not in DEAD_LETTER_FORMATS:
            raise PolicyError("INVALID_DEAD_LETTER_FORMAT")
        if not 0 <= self.message_ttl_ms <= MAX_TTL_MS:
            raise PolicyError("INVALID_MESSAGE_TTL_MS")
        if self.overflow not in OVERFLOWS:
            raise PolicyError("INVALID_OVERFLOW")

    def check_for(self, topic: str, channel: str) -> None:
        """Raise PolicyError if this policy cannot be a policy of ``topic``'s channel: its
        dead letters would go to an invalid name, or back to the topic itself."""
        if not self.max_attempts:
            return
        target = self.dead_letter_topic_for(topic)
        if not is_valid_name(target) or (is_ephemeral(topic) and not self.dead_letter_topic):
            # (a long topic's name with ".dead", or an ephemeral topic's)
            raise PolicyError("INVALID_DEAD_LETTER_TOPIC: name one with dead_letter_topic")
        if target == topic:
            raise PolicyError("INVALID_DEAD_LETTER_TOPIC: the channel's own topic")


NO_POLICY: Final = ChannelPolicy()
#: the settings' names (the parameters of POST /channel/config besides the channel's)
SETTINGS: Final = frozenset(f.name for f in fields(ChannelPolicy))
