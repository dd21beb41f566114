"""One nsqd on many cores: worker processes behind one node (``nsqx nsqd --workers=N``).

The supervisor (:mod:`nsqx.nsqd.supervisor`) binds the node's listeners, holds its data
directory and starts N worker processes, each a whole nsqd over the partitions it owns
(:mod:`.ownership`). A worker takes the connections the kernel gives its listening
socket (SO_REUSEPORT); a publish to a partition another worker owns is forwarded there
and answered once the owner acknowledged it (:mod:`.forwarding`), a subscription is
served by the owner through a proxy consumer (:mod:`.proxy`), both over the links
between workers (:mod:`.links`); the HTTP API answers as one node (:mod:`.http_routes`)
and worker 0 speaks for all to nsqlookupd (:mod:`.topology`). docs/workers.md says why it is built this way and what it measured.
"""
