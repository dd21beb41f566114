"""Protocol V2's rules, apart from any connection: which command each client state
accepts, what a refused one answers, which commands need AUTH, and the state a
command leads to.

The rules are a table (:data:`RULES`, one :class:`Rule` per command), as h11 keeps its
state machine: the connection (nsqx.nsqd.client_v2) looks each command up here before
it executes it, and nothing here reads a socket, a clock or nsqd's state. The states
are nsqd's (stateInit, stateSubscribed, stateClosing; its stateDisconnected is the
connection being gone):

==========  =====================================  ==========================
state       accepts                                leads to
==========  =====================================  ==========================
INIT        IDENTIFY, AUTH, SUB (heartbeats on)    SUB: SUBSCRIBED
SUBSCRIBED  RDY, FIN, REQ, TOUCH, CLS              CLS: CLOSING
CLOSING     FIN, REQ, TOUCH (RDY ignored)
any         NOP, PUB, MPUB, DPUB and the Youzan
            publishes
==========  =====================================  ==========================

Anything else answers E_INVALID "cannot VERB in current state" (fatal, as in nsqd).
With --auth-http-address, SUB and the publishes are checked against the client's
authorizations after these rules (:attr:`Rule.auth`).
"""

from __future__ import annotations

from typing import Final, Protocol, cast, final

from nsqx.wire import commands as cmd
from nsqx.wire.errors import E_INVALID, ProtocolError

__all__ = [
    "ACCEPT",
    "IGNORE",
    "REFUSE",
    "RULES",
    "STATE_CLOSING",
    "STATE_INIT",
    "STATE_SUBSCRIBED",
    "Rule",
    "auth_target",
    "judge",
    "refusal",
]

STATE_INIT: Final = 0
STATE_SUBSCRIBED: Final = 2
STATE_CLOSING: Final = 3

_INIT: Final = 1 << STATE_INIT
_SUBSCRIBED: Final = 1 << STATE_SUBSCRIBED
_CLOSING: Final = 1 << STATE_CLOSING
_ANY: Final = _INIT | _SUBSCRIBED | _CLOSING

#: what :func:`judge` says of a command: execute it, drop it unanswered, or answer
#: :func:`refusal`'s error
ACCEPT: Final = 0
IGNORE: Final = 1
REFUSE: Final = 2


@final
class Rule:
    """One command's rule: the states that accept it (a bit per state), those that
    drop it silently, whether it needs heartbeats, the AUTH verb that checks it ("" for
    none), and the state it leads to when it succeeds (-1: it stays)."""

    def __init__(
        self,
        verb: str,
        accepted: int,
        *,
        ignored: int = 0,
        needs_heartbeats: bool = False,
        auth: str = "",
        then: int = -1,
    ) -> None:
        self.verb = verb
        self.accepted = accepted
        self.ignored = ignored
        self.needs_heartbeats = needs_heartbeats
        self.auth = auth
        self.then = then

    def __repr__(self) -> str:
        return f"Rule({self.verb})"


#: every command event of nsqx.wire.commands (and the parser's errors) -> its rule
RULES: Final[dict[type, Rule]] = {
    ProtocolError: Rule("", _ANY),  # a malformed command: answered as it says
    cmd.Identify: Rule("IDENTIFY", _INIT),
    cmd.Auth: Rule("AUTH", _INIT),
    cmd.Sub: Rule("SUB", _INIT, needs_heartbeats=True, auth="SUB", then=STATE_SUBSCRIBED),
    cmd.Rdy: Rule("RDY", _SUBSCRIBED, ignored=_CLOSING),
    cmd.Fin: Rule("FIN", _SUBSCRIBED | _CLOSING),
    cmd.Req: Rule("REQ", _SUBSCRIBED | _CLOSING),
    cmd.Touch: Rule("TOUCH", _SUBSCRIBED | _CLOSING),
    cmd.Cls: Rule("CLS", _SUBSCRIBED, then=STATE_CLOSING),
    cmd.Nop: Rule("NOP", _ANY),
    cmd.Pub: Rule("PUB", _ANY, auth="PUB"),
    cmd.Pubs: Rule("PUB", _ANY, auth="PUB"),
    cmd.Mpub: Rule("MPUB", _ANY, auth="MPUB"),
    cmd.Dpub: Rule("DPUB", _ANY, auth="DPUB"),
    cmd.PubTrace: Rule("PUB", _ANY, auth="PUB"),
    cmd.MpubTrace: Rule("MPUB", _ANY, auth="MPUB"),
    cmd.PubExt: Rule("PUB", _ANY, auth="PUB"),
    cmd.MpubExt: Rule("MPUB", _ANY, auth="MPUB"),
}


def judge(rule: Rule, state: int, heartbeats: bool) -> int:
    """ACCEPT, IGNORE or REFUSE a command of ``rule`` in ``state`` (``heartbeats``:
    the client's heartbeat interval is not disabled)."""
    bit = 1 << state
    if rule.accepted & bit:
        if rule.needs_heartbeats and not heartbeats:
            return REFUSE
        return ACCEPT
    return IGNORE if rule.ignored & bit else REFUSE


def refusal(rule: Rule, state: int) -> ProtocolError:
    """The error a refused command answers (E_INVALID: fatal)."""
    if rule.accepted & (1 << state):
        return ProtocolError(E_INVALID, f"cannot {rule.verb} with heartbeats disabled")
    return ProtocolError(E_INVALID, f"cannot {rule.verb} in current state")


class _Targeted(Protocol):
    @property
    def topic(self) -> str: ...


def auth_target(ev: object) -> tuple[str, str]:
    """The (topic, channel) a command needing AUTH acts on (channel "" for a publish)."""
    if isinstance(ev, cmd.Sub):
        return ev.topic, ev.channel
    return cast(_Targeted, ev).topic, ""
