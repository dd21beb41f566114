"""nsqx: NSQ in Python, wire-compatible with NSQ 1.3."""

__version__ = "0.1.0"

#: The version string nsqd reports in IDENTIFY and /info (NSQ clients parse it loosely).
NSQ_VERSION = "1.3.0-nsqx"
