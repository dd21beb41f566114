"""The secret the tools and nsqadmin send to a secured cluster, and where it comes from.

An nsqd run with ``--auth-http-address`` asks its clients for AUTH, and nsqd and
nsqlookupd run with ``--http-auth`` ask every HTTP request for ``Authorization: Bearer
<secret>`` (docs/http-auth.md). The tools (``--auth-secret``) and nsqadmin
(``--http-auth-secret``) take that secret the same way: the first line of the flag's
``-file``, else the flag, else :data:`ENV`; it must fit in a Bearer header.
"""

from __future__ import annotations

import os

from nsqx.wire.auth import bearer_secret

__all__ = ["ENV", "check_secret", "load_secret"]

#: where the secret comes from when no flag gives it
ENV = "NSQX_AUTH_SECRET"


def check_secret(secret: str, where: str) -> None:
    """ValueError naming ``where`` unless ``secret`` fits in a Bearer header
    (printable ASCII, no spaces); "" (no secret) passes."""
    if not secret:
        return
    try:
        ok = bearer_secret(f"Bearer {secret}") is not None
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{where}: the secret must be printable ASCII without spaces")


def load_secret(flag_value: str, path: str, flag: str) -> str:
    """The secret: the first line of the file ``path`` when given, else ``flag_value``,
    else ``$NSQX_AUTH_SECRET`` ("" for none). ValueError naming ``flag`` (or its
    ``-file``, or the variable) when the file cannot give one or the secret is no token."""
    if path:
        where = f"{flag}-file"
        try:
            with open(path, encoding="utf-8") as f:
                secret = f.readline().strip()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{where}: {err}") from None
        if not secret:
            raise ValueError(f"{where}: {path} has no secret on its first line")
    elif flag_value:
        where, secret = flag, flag_value
    else:
        where, secret = f"${ENV}", os.environ.get(ENV, "")
    check_secret(secret, where)
    return secret
