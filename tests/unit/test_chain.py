"""The hash chain, pure: sealing, unsealing, and every way a link can break."""

import hashlib

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftrain.events.chain import GENESIS, Broken, ChainHead, Linked, check_link, link_hash, seal, unseal
from ftrain.events.schema import Failed, decode_event, encode_event


def sealed(seq: int, prev: str, reason: str = "preempted", run_id: str = "r1") -> tuple[bytes, str]:
    body = encode_event(Failed(run_id=run_id, seq=seq, prev_hash=prev, reason=reason))
    return seal(body, prev)


def test_hash_is_sha256_of_prev_hash_and_the_stored_body() -> None:
    payload, digest = sealed(1, GENESIS)
    parts = unseal(payload)
    assert parts is not None
    body, claimed, _ = parts
    assert claimed == digest == hashlib.sha256(GENESIS.encode() + body).hexdigest()
    assert msgspec.json.decode(payload)["hash"] == digest  # consumers see it as a plain member
    assert decode_event(payload) == decode_event(body)  # decoders ignore it


@given(st.text(max_size=200))
def test_seal_unseal_round_trip_for_any_reason_text(reason: str) -> None:
    body = encode_event(Failed(run_id="r", seq=1, prev_hash=GENESIS, reason=reason))
    payload, digest = seal(body, GENESIS)
    assert unseal(payload) == (body, digest, None)
    assert link_hash(GENESIS, body) == digest


def test_next_link_is_accepted() -> None:
    p1, h1 = sealed(1, GENESIS)
    first = check_link(ChainHead(), "r1", "failed", p1)
    assert isinstance(first, Linked) and first.hash == h1
    p2, _ = sealed(2, h1)
    assert isinstance(check_link(ChainHead(1, h1, 1), "r1", "failed", p2), Linked)


def test_edited_payload_is_a_hash_mismatch() -> None:
    payload, _ = sealed(1, GENESIS)
    forged = payload.replace(b"preempted", b"oom______")
    result = check_link(ChainHead(), "r1", "failed", forged)
    assert isinstance(result, Broken) and result.reason.startswith("hash mismatch") and result.seq == 1


def test_wrong_prev_hash_sequence_gap_and_misfiled_subject() -> None:
    p1, h1 = sealed(1, GENESIS)
    wrong_prev, _ = sealed(2, "f" * 64)
    result = check_link(ChainHead(1, h1, 1), "r1", "failed", wrong_prev)
    assert isinstance(result, Broken) and "prev_hash" in result.reason
    gap, _ = sealed(3, h1)
    result = check_link(ChainHead(1, h1, 1), "r1", "failed", gap)
    assert isinstance(result, Broken) and result.reason == "sequence gap: expected seq 2, found 3"
    result = check_link(ChainHead(), "r2", "failed", p1)
    assert isinstance(result, Broken) and "stored under run 'r2'" in result.reason
    result = check_link(ChainHead(), "r1", "completed", p1)
    assert isinstance(result, Broken) and "'completed'" in result.reason


def test_unsealed_and_undecodable_payloads_are_broken() -> None:
    assert check_link(ChainHead(), "r1", "failed", b'{"type":"failed"}') == Broken("payload carries no hash")
    junk, _ = seal(b'{"type":"nonsense","x":1}', GENESIS)
    result = check_link(ChainHead(), "r1", "failed", junk)
    assert isinstance(result, Broken) and result.reason.startswith("undecodable payload")
    assert unseal(b"") is None


@pytest.mark.parametrize("prev", ["é" * 64, "F" * 64, "0" * 63, ""])
def test_a_prev_hash_of_any_other_form_is_broken_never_a_crash(prev: str) -> None:
    """One publish with a non-ASCII prev_hash used to raise UnicodeEncodeError in every reader."""
    body = encode_event(Failed(run_id="r1", seq=1, prev_hash=prev, reason="x"))
    digest = hashlib.sha256(prev.encode() + body).hexdigest()
    payload = body[:-1] + f',"hash":"{digest}"}}'.encode()
    result = check_link(ChainHead(), "r1", "failed", payload)
    assert isinstance(result, Broken) and result.reason == f"prev_hash {prev[:12]}… is not 64 hex digits"
