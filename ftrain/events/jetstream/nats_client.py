"""The NATS client ftrain connects with: nats-py's, made fast enough to read the log back in bulk.

Reading the stream is `audit verify`'s and the projector's whole diet, and nats-py 2.16 spends most of it in
per-message machinery: parsing nine headers into a dict (three stored with each event, six added by the
server's direct get; its whitespace test on names goes one character at a time through a generator), a
`Msg` object, a queue hop and a coroutine call. Two changes, both behind nats-py's own interfaces:

- raw subscriptions: a plain function gets each message's header block and payload straight from the
  protocol parser (measured here: 127–145k messages/s against 48–55k through a callback subscription);
- for every other subscription, a header parser with nats-py's contract and a regular-expression test.

nats-py is pinned to the version these hooks (`_process_msg`, `_parse_header_lines`, `Subscription._id`,
`_resp_map`) were written against; the tests exercise both paths on every read.
"""

import re
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.subscription import Subscription

RawHandler = Callable[[bytes | None, bytes], None]

# what str.isspace() calls whitespace among ASCII bytes: \t \n \v \f \r, \x1c-\x1f and space
_WHITESPACE = re.compile(rb"[\t-\r\x1c-\x20]")
_CRLF = b"\r\n"


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """`Name: Value` lines → dict; lines without a colon and names with whitespace or non-ASCII are skipped."""
    out: dict[str, str] = {}
    for line in raw.split(_CRLF):
        name, sep, value = line.partition(b":")
        if sep:
            key = name.strip()
            if key.isascii() and not _WHITESPACE.search(key):
                out[key.decode()] = value.strip().decode("utf-8", "replace")
    return out


def header_value(block: bytes, name: bytes) -> bytes | None:
    """The last value of header `name` in a raw header block (the server appends its own after the stored
    ones, so the last is the server's), or None."""
    start = block.rfind(b"\r\n" + name + b":")
    if start < 0:
        return None
    start += len(name) + 3
    return block[start : block.index(b"\r\n", start)].strip()


def is_status(block: bytes | None) -> bool:
    """Whether a raw header block is a status reply (`NATS/1.0 204 EOB`, `NATS/1.0 404 …`), not a message."""
    return block is None or block.startswith(b"NATS/1.0 ")


class Nats(Client):
    """nats-py's client with raw subscriptions and `parse_header_lines` in place of its own parser."""

    _parse_header_lines = staticmethod(parse_header_lines)

    def __init__(self) -> None:
        super().__init__()
        self._raw_handlers: dict[int, RawHandler] = {}

    async def raw_subscribe(self, subject: str, handler: RawHandler) -> Subscription:
        """Subscribe with `handler(header_block, payload)`, called synchronously from the protocol parser."""
        sub = await self.subscribe(subject)
        self._raw_handlers[sub._id] = handler
        return sub

    async def raw_unsubscribe(self, sub: Subscription) -> None:
        """End a raw subscription."""
        self._raw_handlers.pop(sub._id, None)
        await sub.unsubscribe()

    def fail_requests(self, exc: Exception) -> None:
        """End every request still awaiting its reply with `exc`. For a publish the server refused: its -ERR
        names the subject, not the request, and the refused request would otherwise wait out its timeout."""
        for future in list(self._resp_map.values()):
            if not future.done():
                future.set_exception(exc)

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        handler = self._raw_handlers.get(sid)
        if handler is None:
            await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
        else:
            handler(headers, data)
