"""Credentials never shown: the one place a server URL is made fit for a message or a log line.

A NATS URL may carry a password (`nats://user:secret@host:4222`) or a token (`nats://token@host`); other users
read shared logs and job output, so every URL ftrain prints or logs goes through here first.
"""

import re
from collections.abc import Iterable
from typing import Final

HIDDEN: Final = "***"
_USERINFO: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^@\s/,'\"]+)@")


def _hide(userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{HIDDEN}" if colon else HIDDEN


def redact_url(url: str) -> str:
    """`url` with its password (or token) replaced by `***`; with or without a scheme."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return url
    return f"{scheme}{separator}{_hide(userinfo)}@{host}"


def redact_urls(urls: Iterable[str]) -> str:
    """A comma list of redacted URLs, as a message shows the servers it tried."""
    return ",".join(redact_url(u.strip()) for u in urls)


def redact_text(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Free text (a client's error, say) with URL credentials and each given secret replaced by `***`."""
    text = _USERINFO.sub(lambda m: f"{m.group(1)}{_hide(m.group(2))}@", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, HIDDEN)
    return text
