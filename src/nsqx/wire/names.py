"""Topic and channel name rules: ``^[.a-zA-Z0-9_-]+(#ephemeral)?$``, 1 to 64 characters."""

from __future__ import annotations

import re

EPHEMERAL_SUFFIX = "#ephemeral"
MAX_NAME_LENGTH = 64

_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?")


def is_valid_name(name: str) -> bool:
    """True for a legal topic or channel name."""
    return 1 <= len(name) <= MAX_NAME_LENGTH and _NAME_RE.fullmatch(name) is not None


is_valid_topic_name = is_valid_name
is_valid_channel_name = is_valid_name


def is_ephemeral(name: str) -> bool:
    """True for a ``#ephemeral`` topic or channel: memory-only, deleted with its last user."""
    return name.endswith(EPHEMERAL_SUFFIX)
