"""TLS for nsqd: the server SSLContext (TCP upgrade and HTTPS) and the in-memory TLS
session a connection runs after IDENTIFY negotiated ``tls_v1``.

The session works on memory buffers (ssl.MemoryBIO) instead of asyncio's start_tls so
that the connection keeps one transport and one protocol: bytes the client sent right
behind IDENTIFY are fed into the handshake rather than lost, compression stacks on top
without another transport, and no coroutine has to run in the middle of a read.
"""

from __future__ import annotations

import ssl
import warnings

from nsqx.nsqd.options import NsqdOptions

__all__ = ["TLS_VERSIONS", "TLSSession", "build_server_context", "tls_enabled"]

#: --tls-min-version values and the versions they name.
TLS_VERSIONS = {
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}


def tls_enabled(options: NsqdOptions) -> bool:
    """True when nsqd has a certificate (--tls-cert/--tls-key), as NSQ decides."""
    return bool(options.tls_cert or options.tls_key)


def build_server_context(options: NsqdOptions) -> ssl.SSLContext | None:
    """The server context of --tls-cert/--tls-key, or None when neither is set.

    --tls-client-auth-policy: ``require`` and ``require-verify`` both make the handshake
    fail without a client certificate, and verify it against --tls-root-ca-file (the
    system's CAs without it). NSQ's ``require`` accepts any certificate unverified;
    Python's ssl module cannot request a certificate without verifying it, so a
    self-signed client certificate needs its CA in --tls-root-ca-file here. Without a
    policy no certificate is requested. --tls-min-version sets the oldest version
    accepted (the system's OpenSSL policy may refuse TLS 1.0/1.1 regardless).

    Raises OSError/ssl.SSLError/ValueError for unreadable or mismatched files.
    """
    if not tls_enabled(options):
        return None
    if not options.tls_cert or not options.tls_key:
        raise ValueError("--tls-cert and --tls-key must be given together")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(options.tls_cert, options.tls_key)
    version = TLS_VERSIONS.get(options.tls_min_version)
    if version is None:
        raise ValueError(f"--tls-min-version {options.tls_min_version!r} is not supported")
    with warnings.catch_warnings():
        # Python deprecates TLS 1.0/1.1; NSQ's flag still offers them (default tls1.0)
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = version
    if options.tls_client_auth_policy in ("require", "require-verify"):
        ctx.verify_mode = ssl.CERT_REQUIRED
        if options.tls_root_ca_file:
            ctx.load_verify_locations(cafile=options.tls_root_ca_file)
        else:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    # nsqd sends no session tickets a client could resume with; nor do we
    ctx.options |= ssl.OP_NO_TICKET
    return ctx


class TLSSession:
    """The server side of one TLS connection over memory buffers.

    ``receive(data)`` takes bytes from the socket and returns decrypted application data;
    ``send(data)`` encrypts; ``outgoing()`` returns the bytes to write to the socket
    (handshake messages, records, alerts). Raises ssl.SSLError on a failed handshake or
    a corrupt record.
    """

    def __init__(self, context: ssl.SSLContext) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        #: True once the handshake completed.
        self.established = False
        #: True once the peer sent close_notify.
        self.peer_closed = False

    @property
    def ssl_object(self) -> ssl.SSLObject:
        """The session (cipher, version, peer certificate), e.g. for /stats."""
        return self._ssl

    def receive(self, data: bytes) -> bytes:
        """Feed socket bytes; return the application data they complete."""
        self._incoming.write(data)
        sslobj = self._ssl
        if not self.established:
            try:
                sslobj.do_handshake()
            except ssl.SSLWantReadError:
                return b""
            self.established = True
        chunks: list[bytes] = []
        while True:
            try:
                chunk = sslobj.read(262144)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.peer_closed = True
                break
            if not chunk:
                # SSLObject.read answers b"" once the peer's close_notify arrived
                self.peer_closed = True
                break
            chunks.append(chunk)
        if len(chunks) == 1:
            return chunks[0]
        return b"".join(chunks)

    def send(self, data: bytes) -> None:
        """Encrypt ``data`` (only once established); collect it with :meth:`outgoing`."""
        view = memoryview(data)
        while view:
            n = self._ssl.write(view)
            view = view[n:]

    def outgoing(self) -> bytes:
        """Everything produced for the socket so far."""
        return self._outgoing.read()

    def close_notify(self) -> bytes:
        """The close_notify alert to send before hanging up (best effort)."""
        try:
            self._ssl.unwrap()
        except (ssl.SSLError, ValueError):
            pass
        return self._outgoing.read()

    def peer_common_name(self) -> str:
        """The CN of the client certificate's subject, or "" without one."""
        cert = self._ssl.getpeercert()
        if not cert:
            return ""
        for rdn in cert.get("subject", ()):
            for attr in rdn:
                if attr[0] == "commonName":
                    return str(attr[1])
        return ""

    def describe(self) -> tuple[str, str]:
        """(TLS version, cipher suite) once established."""
        cipher = self._ssl.cipher()
        return (self._ssl.version() or "", cipher[0] if cipher else "")
