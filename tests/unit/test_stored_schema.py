"""The JSON Schema of a stored payload (`ftrain events schema`, served with the docs) must accept every payload
a writer stores and refuse one that lacks the chain's members: checked with a standard draft 2020-12
validator (`jsonschema`), as a consumer would, and member by member with `re` so a refusal names its member
(the command itself: tests/integration/test_stored_schema_cli.py)."""

import json
import re
from typing import Any

import jsonschema
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ftrain.events.chain import GENESIS, seal
from ftrain.events.schema import (
    Failed,
    PartReplicas,
    SnapshotPart,
    SnapshotReplicated,
    Snapshotted,
    encode_event,
    now,
)
from ftrain.events.signing import Signer
from ftrain.events.stored_schema import ENVELOPE, stored_schema
from tests.support.paths import VECTORS

STORED = [
    v["payload"]
    for name in ("events.json", "events-before-attempts.json")
    for v in json.loads((VECTORS / name).read_text("utf-8"))
] + [v["payload"] for v in json.loads((VECTORS / "signed-events.json").read_text("utf-8"))["events"]]


def variant_of(schema: dict[str, Any], event_type: str) -> dict[str, Any]:
    """The variant of the schema's `anyOf` whose `type` enum names `event_type`."""
    variants = [schema["$defs"][ref["$ref"].removeprefix("#/$defs/")] for ref in schema["anyOf"]]
    (variant,) = [v for v in variants if v["properties"]["type"]["enum"] == [event_type]]
    return variant


def validator() -> jsonschema.Draft202012Validator:
    """A standard validator of the schema's draft, checking formats (`date-time`) too."""
    schema = stored_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def problems(schema: dict[str, Any], payload: dict[str, Any]) -> list[str]:
    """What a validator would report for `payload` against its type's variant (required, known, patterns)."""
    variant = variant_of(schema, payload["type"])
    properties = variant["properties"]
    found = [f"missing {name}" for name in variant["required"] if name not in payload]
    found += [f"unknown {name}" for name in payload if name not in properties]
    found += [
        f"{name} does not match {properties[name]['pattern']}"
        for name, value in payload.items()
        if "pattern" in properties.get(name, {}) and not re.search(properties[name]["pattern"], value)
    ]
    found += [
        f"{name} without {other}"
        for name, others in variant["dependentRequired"].items()
        if name in payload
        for other in others
        if other not in payload
    ]
    return found


def signed_payload() -> dict[str, Any]:
    """A payload as a signing writer stores it."""
    event = Failed(run_id="r-1", seq=1, id="0" * 32, time=now(), prev_hash=GENESIS, reason="preempted")
    signer = Signer(Ed25519PrivateKey.generate())
    payload, _ = seal(encode_event(event), GENESIS, signer.sign_hash)
    doc: dict[str, Any] = json.loads(payload)
    return doc


@pytest.mark.parametrize("payload", STORED, ids=lambda p: str(json.loads(p)["type"]))
def test_the_schema_accepts_every_stored_vector(payload: str) -> None:
    assert problems(stored_schema(), json.loads(payload)) == []
    assert list(validator().iter_errors(json.loads(payload))) == []


def test_the_schema_is_plain_draft_2020_12_without_vendor_keywords() -> None:
    """OpenAPI's `discriminator` made generic validators stumble (a strict one refuses an unknown keyword)."""
    schema = stored_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert "discriminator" not in json.dumps(schema)
    assert jsonschema.validators.validator_for(schema) is jsonschema.Draft202012Validator


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("id", "0" * 31),
        ("run_id", "a.b"),
        ("hash", "A" * 64),
        ("time", "yesterday"),
        ("seq", 0),
        ("type", "x"),
    ],
)
def test_a_standard_validator_refuses_a_payload_with_a_malformed_member(member: str, value: object) -> None:
    doc = json.loads(STORED[0])
    assert validator().is_valid(doc)
    doc[member] = value
    assert not validator().is_valid(doc)


def test_the_schema_accepts_a_signed_payload_and_requires_signer_and_sig_together() -> None:
    schema, doc = stored_schema(), signed_payload()
    assert list(doc)[-3:] == ["hash", "signer", "sig"]
    assert problems(schema, doc) == []
    del doc["sig"]
    assert problems(schema, doc) == ["signer without sig"]


def test_the_schema_refuses_a_payload_without_its_hash() -> None:
    doc = json.loads(STORED[0])
    del doc["hash"]
    assert problems(stored_schema(), doc) == ["missing hash"]


def test_the_schema_refuses_malformed_envelope_members() -> None:
    doc = json.loads(STORED[1])
    doc.update(run_id="a.b", id="not-an-id", prev_hash="ABC", checkpoint_hash="sha256:" + "0" * 64)
    assert problems(stored_schema(), doc) == [
        f"{name} does not match {pattern}"
        for name, pattern in (
            ("run_id", "^[A-Za-z0-9][A-Za-z0-9_-]*$"),
            ("id", "^(?:[0-9a-f]{32}|[0-9A-HJKMNP-TV-Z]{26})$"),
            ("prev_hash", "^[0-9a-f]{64}$"),
            ("checkpoint_hash", "^[0-9a-f]{64}$"),
        )
    ]


def test_every_variant_requires_the_envelope_and_stamps_time_as_a_date_time() -> None:
    schema = stored_schema()
    for ref in schema["anyOf"]:
        variant = schema["$defs"][ref["$ref"].removeprefix("#/$defs/")]
        assert variant["required"][: len(ENVELOPE)] == list(ENVELOPE)
        assert variant["properties"]["time"]["format"] == "date-time"
        assert {"hash", "signer", "sig"} <= variant["properties"].keys()


def test_a_resumed_names_a_checkpoint_or_is_the_restart_form() -> None:
    resumed = stored_schema()["$defs"]["Resumed"]
    assert resumed["if"] == {"properties": {"checkpoint_seq": {"const": 0}}}
    restart = resumed["then"]["properties"]
    assert {k: v["const"] for k, v in restart.items()} == {
        "step": 0,
        "epoch": 0,
        "uri": "",
        "checkpoint_hash": "",
    }
    assert resumed["else"]["properties"]["checkpoint_hash"]["pattern"] == "^[0-9a-f]{64}$"
    assert "restart form" in resumed["description"]


def test_the_schema_accepts_a_snapshot_naming_its_parts_and_the_end_of_its_replica_exchange() -> None:
    parts = (SnapshotPart(node=0, host="gpu-a", first_rank=0, ranks=2, size_bytes=30, replica_node=1),
             SnapshotPart(node=1, host="gpu-b", first_rank=2, ranks=2, size_bytes=50, replica_node=0))  # fmt: skip
    stamp = {"run_id": "r-1", "id": "0" * 32, "time": now(), "prev_hash": GENESIS}
    for event in (
        Snapshotted(**stamp, seq=2, step=40, epoch=0, shards=4, uri="file:///dev/shm/s",
                    checkpoint_hash="ab" * 32, size_bytes=80, attempt=1, parts=parts),
        SnapshotReplicated(**stamp, seq=3, snapshot_seq=2, step=40, checkpoint_hash="ab" * 32, attempt=1,
                           replicas=(PartReplicas(node=0, landed=2), PartReplicas(node=1, landed=1, failed=1))),
    ):  # fmt: skip
        payload, _ = seal(encode_event(event), GENESIS, None)
        assert list(validator().iter_errors(json.loads(payload))) == []
        forged = {**json.loads(payload), "checkpoint_hash": "AB" * 32}
        assert problems(stored_schema(), forged) == ["checkpoint_hash does not match ^[0-9a-f]{64}$"]
