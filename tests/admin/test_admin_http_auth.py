"""nsqadmin in front of nsqd and nsqlookupd that run with ``--http-auth=all`` (real
processes, a real auth server: tests/authserver.py): its own secret
(``--http-auth-secret``), a user's secret passed on (``--http-auth-forward``), what it
answers when a node refuses it, and bad flags."""

from __future__ import annotations

import http.server
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adminproc import AdminProcess, start_admin
from authserver import AuthServer, auth_server, grant
from lookupdproc import LookupdProcess, http_request, start_lookupd, wait_until
from nsqdproc import NsqdProcess, start_nsqd

SECRETS: dict[str, dict[str, Any]] = {
    "root": grant({"topic": ".*", "channels": [".*"], "permissions": ["admin"]}),
    "reader": grant({"topic": ".*", "channels": [".*"], "permissions": ["subscribe"]}),
    "orders-admin": grant(
        {"topic": ".*", "channels": [".*"], "permissions": ["subscribe"]},
        {"topic": "^orders$", "channels": [".*"], "permissions": ["admin"]},
    ),
    "publisher": grant({"topic": ".*", "channels": [".*"], "permissions": ["publish"]}),
}


@dataclass
class Guarded:
    """An auth server, nsqlookupd and an nsqd that both ask it for every request."""

    auth: AuthServer
    lookupd: LookupdProcess
    nsqd: NsqdProcess

    def nsqd_get(self, path: str) -> Any:
        status, _, body = http_request(
            f"{self.nsqd.http_url}{path}", headers={"Authorization": "Bearer root"}
        )
        assert status == 200, body
        return json.loads(body)

    def paused(self, topic: str) -> bool:
        (t,) = self.nsqd_get(f"/stats?format=json&topic={topic}")["topics"]
        return bool(t["paused"])

    def admin(self, *args: str) -> AdminProcess:
        return start_admin(f"--lookupd-http-address={self.lookupd.http_address}", *args)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    with auth_server() as auth:
        auth.answers.update(SECRETS)
        flags = [f"--auth-http-address={auth.address}", "--http-auth=all"]
        lookupd = start_lookupd(*flags)
        try:
            nsqd = start_nsqd(
                tmp_path_factory.mktemp("nsqd"),
                "--http-address=127.0.0.1:0",
                "--broadcast-address=127.0.0.1",
                f"--lookupd-tcp-address={lookupd.tcp_address}",
                *flags,
            )
        except BaseException:
            lookupd.stop(signal.SIGKILL)
            raise
        try:
            for topic in ("orders", "payments"):
                for path in (
                    f"/topic/create?topic={topic}",
                    f"/channel/create?topic={topic}&channel=audit",
                ):
                    status, _, body = http_request(
                        f"{nsqd.http_url}{path}",
                        method="POST",
                        headers={"Authorization": "Bearer root"},
                    )
                    assert status == 200, body
            g = Guarded(auth, lookupd, nsqd)
            wait_until(
                lambda: http_request(
                    f"http://{lookupd.http_address}/topics",
                    headers={"Authorization": "Bearer root"},
                )[2].count(b"orders"),
                what="the topics registered",
            )
            yield g
        finally:
            nsqd.stop(signal.SIGKILL)
            lookupd.stop(signal.SIGKILL)


def test_without_a_secret_the_admin_says_why_it_sees_nothing(guarded: Guarded) -> None:
    admin = guarded.admin()
    try:
        status, data = admin.request("GET", "/api/topics")
        assert status == 502
        assert "401" in data["message"] and "AUTH_REQUIRED" in data["message"]
    finally:
        admin.stop()


def test_its_own_secret_reads_and_acts(guarded: Guarded) -> None:
    admin = guarded.admin("--http-auth-secret=root")
    try:
        assert {"orders", "payments"} <= set(admin.get("/api/topics")["topics"])
        (node,) = admin.get("/api/nodes")["nodes"]
        assert node["health"] == "OK"
        assert admin.get("/api/topics/orders")["topic_name"] == "orders"
        status, data = admin.request("POST", "/api/topics/payments", {"action": "pause"})
        assert status == 200, data
        assert guarded.paused("payments")
        status, data = admin.request("POST", "/api/topics/payments", {"action": "unpause"})
        assert status == 200, data
        assert not guarded.paused("payments")
        asked = {q["secret"] for q in guarded.auth.queries}
        assert "root" in asked
    finally:
        admin.stop()


def test_its_secret_from_the_environment(guarded: Guarded) -> None:
    """$NSQX_AUTH_SECRET, as the tools take it, when no flag gives one."""
    admin = start_admin(
        f"--lookupd-http-address={guarded.lookupd.http_address}", env={"NSQX_AUTH_SECRET": "root"}
    )
    try:
        assert {"orders", "payments"} <= set(admin.get("/api/topics")["topics"])
    finally:
        admin.stop()


def test_a_secret_without_admin_cannot_act(guarded: Guarded) -> None:
    admin = guarded.admin("--http-auth-secret=reader")
    try:
        assert "orders" in admin.get("/api/topics")["topics"]
        status, data = admin.request("POST", "/api/topics/orders", {"action": "pause"})
        assert status == 502 and "403 UNAUTHORIZED" in data["message"], data
        assert not guarded.paused("orders")
    finally:
        admin.stop()


class Receiver:
    """A notification endpoint that records the headers of what is POSTed to it."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        seen = self.headers

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.append(dict(self.headers))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notify"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_users_secret_is_passed_on(guarded: Guarded, tmp_path: Path) -> None:
    receiver = Receiver()
    secret_file = tmp_path / "secret"
    secret_file.write_text("reader\nignored\n")
    admin = guarded.admin(
        f"--http-auth-secret-file={secret_file}",
        "--http-auth-forward",
        f"--notification-http-endpoint={receiver.url}",
    )
    try:

        def as_user(secret: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
            return admin.request(method, path, body, headers={"Authorization": f"Bearer {secret}"})

        # without a user's secret: the admin's own (the file's first line), which reads
        assert "orders" in admin.get("/api/topics")["topics"]
        status, data = admin.request("POST", "/api/topics/orders", {"action": "pause"})
        assert status == 502 and "403 UNAUTHORIZED" in data["message"]
        # the user may administer orders, not payments
        guarded.auth.queries.clear()
        assert as_user("orders-admin", "POST", "/api/topics/orders", {"action": "pause"})[0] == 200
        assert guarded.paused("orders")
        assert "orders-admin" in {q["secret"] for q in guarded.auth.queries}
        status, data = as_user("orders-admin", "POST", "/api/topics/payments", {"action": "pause"})
        assert status == 502 and "403 UNAUTHORIZED" in data["message"]
        assert not guarded.paused("payments")
        assert (
            as_user("orders-admin", "POST", "/api/topics/orders", {"action": "unpause"})[0] == 200
        )
        assert not guarded.paused("orders")
        # a user whose secret the auth server refuses sees why
        status, data = as_user("stranger", "GET", "/api/topics")
        assert status == 502 and "AUTH_FAILED" in data["message"]
        # a Bearer header that is no secret is refused by the admin itself
        status, data = admin.request(
            "GET", "/api/topics", headers={"Authorization": "Bearer two words"}
        )
        assert (status, data["message"]) == (400, "INVALID_AUTHORIZATION")
        # notifications go outside the cluster: never with a secret
        wait_until(lambda: len(receiver.headers) >= 2, what="the notifications")
        assert all("Authorization" not in h for h in receiver.headers)
    finally:
        admin.stop()
        receiver.close()


@pytest.mark.parametrize(
    ("args", "status", "text"),
    [
        (["--http-auth-secret=two words"], 2, "--http-auth-secret: the secret must be"),
        (["--http-auth-secret=caf\u00e9"], 2, "--http-auth-secret: the secret must be"),
        (["--http-auth-secret-file=/nonexistent/secret"], 1, "--http-auth-secret-file"),
    ],
)
def test_bad_flags_are_one_line(args: list[str], status: int, text: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "nsqx", "nsqadmin", "--http-address=127.0.0.1:0",
         "--lookupd-http-address=127.0.0.1:1", *args],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == status, proc.stderr
    assert text in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_empty_secret_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    proc = subprocess.run(
        [sys.executable, "-m", "nsqx", "nsqadmin", "--http-address=127.0.0.1:0",
         "--lookupd-http-address=127.0.0.1:1", f"--http-auth-secret-file={empty}"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "has no secret on its first line" in proc.stderr
