"""nsqlookupd: the registry of which nsqd has which topic and channel, with its TCP
protocol V1 (for nsqd) and HTTP API (for consumers and operators)."""

from nsqx.lookupd.nsqlookupd import NSQLookupd
from nsqx.lookupd.options import LookupdOptions

__all__ = ["LookupdOptions", "NSQLookupd"]
