"""AUTH: asking --auth-http-address servers what a client's secret allows.

nsqd sends ``GET /auth?common_name=&remote_ip=&secret=&tls=`` and expects
``{"ttl": s, "identity", "identity_url", "authorizations": [{"topic": re,
"channels": [re], "permissions": ["subscribe"|"publish"]}]}``. Topic and channel
patterns are unanchored regular expressions; a publish check matches the channel
patterns against "" (so a publisher needs a channel pattern such as ``.*``), exactly as
NSQ's internal/auth does.

The protocol is sans-IO in :mod:`nsqx.wire.auth` and the client in
:mod:`nsqx.http_auth`, where nsqlookupd's ``--http-auth`` finds them too; the TCP
protocol (client_v2) takes them from here.
"""

from __future__ import annotations

from nsqx.http_auth import AuthClient
from nsqx.wire.auth import AuthError, Authorization, AuthState, parse_auth_response

__all__ = ["AuthClient", "AuthError", "AuthState", "Authorization", "parse_auth_response"]
