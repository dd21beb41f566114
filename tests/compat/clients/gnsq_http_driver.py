"""Drive nsqd's HTTP API with gnsq 1.0.2's NsqdHTTPClient: ``gnsq_http_driver.py HOST:PORT TOPIC``.

Uses only gnsq's public HTTP client (urllib3 underneath, ``Accept: application/vnd.nsq
version=1.0`` as gnsq sends it). Prints one JSON line with what each call returned.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import gnsq
from gnsq.errors import NSQHttpError


def main() -> None:
    host, _, port = sys.argv[1].rpartition(":")
    topic = sys.argv[2]
    http = gnsq.NsqdHTTPClient(host, int(port), timeout=10.0)
    out: dict[str, Any] = {"client": "gnsq-http"}
    out["ping"] = http.ping().decode()
    out["info"] = http.info()
    out["create_topic"] = http.create_topic(topic).decode()
    out["create_channel"] = http.create_channel(topic, "ch").decode()
    out["publish"] = http.publish(topic, b"one").decode()
    out["publish_defer"] = http.publish(topic, b"later", defer=60000).decode()
    out["mpub_text"] = http.multipublish(topic, [b"two", b"three"]).decode()
    out["mpub_binary"] = http.multipublish(topic, [b"four\n", b"\x00five"], binary=True).decode()
    out["pause_channel"] = http.pause_channel(topic, "ch").decode()
    out["stats"] = http.stats(topic=topic, channel="ch")
    out["stats_text"] = http.stats(text=True).decode()
    out["unpause_channel"] = http.unpause_channel(topic, "ch").decode()
    out["pause_topic"] = http.pause_topic(topic).decode()
    out["unpause_topic"] = http.unpause_topic(topic).decode()
    out["empty_channel"] = http.empty_channel(topic, "ch").decode()
    out["stats_after_empty"] = http.stats(topic=topic)
    out["empty_topic"] = http.empty_topic(topic).decode()
    out["delete_channel"] = http.delete_channel(topic, "ch").decode()
    out["delete_topic"] = http.delete_topic(topic).decode()
    try:
        http.delete_topic(topic)
        out["delete_again"] = "no error"
    except NSQHttpError as err:
        out["delete_again"] = str(err)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
