"""Test helpers for upgraded connections: certificates (trustme), and a raw protocol
client that negotiates TLS and/or snappy/deflate in IDENTIFY, built on nsqx.wire."""

from __future__ import annotations

import asyncio
import json
import ssl
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme

from nsqx.nsqd.nsqd import NSQD
from nsqx.wire import FRAME_RESPONSE, HEARTBEAT, MAGIC_V2
from nsqx.wire import commands as c
from nsqx.wire.compression import Compressor, Decompressor, codec_pair

from rawnsq import Raw


@dataclass
class Certs:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate; PEM files."""

    ca: trustme.CA
    dir: Path
    ca_file: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str

    def client_context(self, with_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if with_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx

    def nsqd_options(self, **more: Any) -> dict[str, Any]:
        return {"tls_cert": self.server_cert, "tls_key": self.server_key, **more}

    def nsqd_flags(self) -> list[str]:
        return [f"--tls-cert={self.server_cert}", f"--tls-key={self.server_key}"]


def make_certs(directory: Path, client_cn: str = "client-one") -> Certs:
    """Write a fresh CA, server and client certificate under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client.example", common_name=client_cn)
    paths = {}
    for name, blob in {
        "ca.pem": ca.cert_pem,
        "server.pem": server.cert_chain_pems[0],
        "server.key": server.private_key_pem,
        "client.pem": client.cert_chain_pems[0],
        "client.key": client.private_key_pem,
    }.items():
        path = directory / name
        blob.write_to_path(str(path))
        paths[name] = str(path)
    return Certs(
        ca,
        directory,
        paths["ca.pem"],
        paths["server.pem"],
        paths["server.key"],
        paths["client.pem"],
        paths["client.key"],
    )


class UpgradedRaw(Raw):
    """A Raw connection that can compress what it sends and decompress what it reads."""

    compressor: Compressor | None = None
    decompressor: Decompressor | None = None

    @classmethod
    async def open(cls, address: tuple[str, int]) -> UpgradedRaw:
        r, w = await asyncio.open_connection(*address)
        raw = cls(r, w)
        w.write(MAGIC_V2)
        return raw

    @classmethod
    async def connect(cls, nsqd: NSQD, magic: bool = True) -> UpgradedRaw:
        assert nsqd.tcp_address is not None
        raw = await cls.open(nsqd.tcp_address)
        return raw

    def send(self, data: bytes) -> None:
        if self.compressor is not None:
            data = self.compressor.compress(data)
        self.writer.write(data)

    async def _fill(self, timeout: float) -> bool:
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 20), timeout)
        except TimeoutError:
            return True
        if not data:
            return False
        if self.decompressor is not None:
            data = self.decompressor.decompress(data)
        for ftype, payload in self.decoder.feed(data):
            if ftype == FRAME_RESPONSE and payload == HEARTBEAT and self.answer_heartbeats:
                self.send(c.nop())
                continue
            self.frames.append((ftype, payload))
        return True

    async def read_frame_exactly(self) -> tuple[int, bytes]:
        """One frame read byte-exactly, leaving what follows unread (before an upgrade)."""
        head = await asyncio.wait_for(self.reader.readexactly(8), 10)
        size, ftype = struct.unpack(">ii", head)
        return ftype, await asyncio.wait_for(self.reader.readexactly(size - 4), 10)

    async def negotiate(
        self, ssl_context: ssl.SSLContext | None = None, **fields: Any
    ) -> dict[str, Any]:
        """IDENTIFY with feature negotiation, then do every upgrade the server agreed to
        (TLS handshake and its OK, then the compressed OK). Returns the IDENTIFY JSON."""
        fields.setdefault("feature_negotiation", True)
        if ssl_context is not None:
            fields.setdefault("tls_v1", True)
        self.writer.write(c.identify(fields))
        ftype, payload = await self.read_frame_exactly()
        assert ftype == FRAME_RESPONSE, (ftype, payload)
        resp: dict[str, Any] = json.loads(payload)
        await self.upgrade(resp, ssl_context)
        return resp

    async def upgrade(
        self, resp: dict[str, Any], ssl_context: ssl.SSLContext | None = None
    ) -> None:
        """Do every upgrade an IDENTIFY response agreed to (TLS, then compression)."""
        if resp.get("tls_v1"):
            assert ssl_context is not None
            await asyncio.wait_for(
                self.writer.start_tls(ssl_context, server_hostname="127.0.0.1"), 10
            )
            assert await self.read_frame_exactly() == (FRAME_RESPONSE, b"OK")
        pair = codec_pair(
            bool(resp.get("snappy")), bool(resp.get("deflate")), resp.get("deflate_level") or 6
        )
        if pair is not None:
            self.compressor, self.decompressor = pair
            assert await self.response() == b"OK"
