"""Protocol V2's rules (nsqx.nsqd.protocol_v2) alone: a table, checked without a
connection, against nsqd 1.3's answers."""

from __future__ import annotations

import typing

import pytest

from nsqx.nsqd import protocol_v2 as pv2
from nsqx.nsqd.protocol_v2 import STATE_CLOSING, STATE_INIT, STATE_SUBSCRIBED
from nsqx.wire import commands as cmd
from nsqx.wire.errors import E_INVALID, ProtocolError

STATES = (STATE_INIT, STATE_SUBSCRIBED, STATE_CLOSING)
A, IG, R = pv2.ACCEPT, pv2.IGNORE, pv2.REFUSE

#: nsqd 1.3's protocol_v2.go, command by command: (INIT, SUBSCRIBED, CLOSING)
EXPECTED = {
    "IDENTIFY": (A, R, R),
    "AUTH": (A, R, R),
    "SUB": (A, R, R),
    "RDY": (R, A, IG),
    "FIN": (R, A, A),
    "REQ": (R, A, A),
    "TOUCH": (R, A, A),
    "CLS": (R, A, R),
    "NOP": (A, A, A),
    "PUB": (A, A, A),
    "MPUB": (A, A, A),
    "DPUB": (A, A, A),
}


def test_every_command_has_a_rule() -> None:
    kinds = set(typing.get_args(cmd.Event))
    assert kinds == set(pv2.RULES)


@pytest.mark.parametrize("kind", list(pv2.RULES), ids=lambda k: k.__name__)
def test_each_state_accepts_what_nsqd_accepts(kind: type) -> None:
    rule = pv2.RULES[kind]
    if not rule.verb:
        assert [pv2.judge(rule, s, True) for s in STATES] == [A, A, A]
        return
    assert tuple(pv2.judge(rule, s, True) for s in STATES) == EXPECTED[rule.verb]


def test_a_refusal_answers_e_invalid_in_nsqds_words() -> None:
    err = pv2.refusal(pv2.RULES[cmd.Cls], STATE_INIT)
    assert (err.code, str(err), err.fatal) == (
        E_INVALID,
        "E_INVALID cannot CLS in current state",
        True,
    )
    sub = pv2.RULES[cmd.Sub]
    assert pv2.judge(sub, STATE_INIT, False) == R
    assert str(pv2.refusal(sub, STATE_INIT)) == "E_INVALID cannot SUB with heartbeats disabled"
    # state first, as nsqd: a second SUB is refused for its state, heartbeats or not
    assert str(pv2.refusal(sub, STATE_SUBSCRIBED)) == "E_INVALID cannot SUB in current state"


def test_states_follow_sub_and_cls() -> None:
    assert pv2.RULES[cmd.Sub].then == STATE_SUBSCRIBED
    assert pv2.RULES[cmd.Cls].then == STATE_CLOSING
    others = [r for k, r in pv2.RULES.items() if k not in (cmd.Sub, cmd.Cls)]
    assert all(r.then == -1 for r in others)


def test_auth_covers_sub_and_every_publish() -> None:
    needs = {k.__name__: r.auth for k, r in pv2.RULES.items() if r.auth}
    assert needs == {
        "Sub": "SUB",
        "Pub": "PUB",
        "Pubs": "PUB",
        "Mpub": "MPUB",
        "Dpub": "DPUB",
        "PubTrace": "PUB",
        "MpubTrace": "MPUB",
        "PubExt": "PUB",
        "MpubExt": "MPUB",
    }
    parser = cmd.CommandParser()
    sub, pub = parser.feed(cmd.MAGIC_V2 + cmd.sub("t", "c") + cmd.pub("t", b"x"))
    assert pv2.auth_target(sub) == ("t", "c")
    assert pv2.auth_target(pub) == ("t", "")
    assert not isinstance(pub, ProtocolError)
