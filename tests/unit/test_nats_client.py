"""ftrain's header parser must agree with nats-py's own on every input."""

from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client

from ftrain.events.jetstream.nats_client import Nats, parse_header_lines

SERVER_HEADERS = (
    b"Nats-Msg-Id: 5b1c\r\nNats-Expected-Last-Subject-Sequence: 41\r\n"
    b"Nats-Expected-Last-Subject-Sequence-Subject: ftrain.run.r1.*\r\nNats-Stream: FTRAIN_EVENTS\r\n"
    b"Nats-Subject: ftrain.run.r1.failed\r\nNats-Sequence: 42\r\nNats-Time-Stamp: 2026-11-29T12:00:00Z\r\n\r\n"
)


def test_a_direct_get_header_block() -> None:
    parsed = parse_header_lines(SERVER_HEADERS)
    assert parsed == Client._parse_header_lines(SERVER_HEADERS)
    assert parsed["Nats-Sequence"] == "42" and parsed["Nats-Subject"] == "ftrain.run.r1.failed"


@given(
    st.lists(
        st.binary(max_size=40) | st.sampled_from([b"a b: c", b"k:\tv", b"\xff: x", b"x", b":", b" k : v "])
    )
)
def test_same_result_as_nats_py_for_any_lines(lines: list[bytes]) -> None:
    raw = b"\r\n".join(lines)
    assert parse_header_lines(raw) == Client._parse_header_lines(raw)


def test_the_client_uses_it() -> None:
    assert Nats._parse_header_lines is parse_header_lines


def test_raw_header_helpers_take_the_servers_value() -> None:
    from ftrain.events.jetstream.nats_client import header_value, is_status

    block = b"NATS/1.0\r\nNats-Sequence: 999\r\nX: 1\r\nNats-Sequence: 42\r\nNats-Subject: a.b\r\n\r\n"
    assert header_value(block, b"Nats-Sequence") == b"42"
    assert header_value(block, b"Nats-Subject") == b"a.b"
    assert header_value(block, b"Missing") is None
    assert is_status(b"NATS/1.0 204 EOB\r\nNats-Num-Pending: 0\r\n\r\n")
    assert is_status(None)
    assert not is_status(block)
