"""The JSON Schema of a stored payload, what stream consumers actually receive (`ftrain events schema`).

It is msgspec's schema of the event union, so it never drifts from the structs, tightened to what writers
store: the envelope stamped at append is required and patterned, and the trailing chain members
(`events.chain`) are added. Unknown members stay allowed: a newer writer may add fields. Plain JSON Schema
2020-12, so any validator reads it: msgspec's `discriminator` (an OpenAPI keyword) is left out, each variant's
`type` enum already tells them apart. The docs site publishes `schema_text()` as `schema/event.schema.json`.
"""

from typing import Any

import msgspec

from ftrain.events.run_id import RUN_ID_MAX, RUN_ID_PATTERN
from ftrain.events.schema import AnyEvent, Checkpointed, Resumed, SnapshotReplicated, Snapshotted

ENVELOPE = ("type", "run_id", "seq", "id", "time", "actor", "prev_hash", "hash")
HEX64 = "^[0-9a-f]{64}$"
EVENT_ID = "^(?:[0-9a-f]{32}|[0-9A-HJKMNP-TV-Z]{26})$"
"""`uuid.uuid4().hex` as the store stamps it, or a 26-character ULID a writer supplied (the test vectors)."""

_TRAILER: dict[str, dict[str, Any]] = {
    "hash": {
        "type": "string",
        "pattern": HEX64,
        "description": "SHA-256 of prev_hash (ASCII hex) followed by this payload without its trailing "
        "hash/signer/sig members; always present, after the event's own fields.",
    },
    "signer": {
        "type": "string",
        "pattern": HEX64,
        "description": "The writer's Ed25519 public key; present, with sig, when the writer signed.",
    },
    "sig": {
        "type": "string",
        "pattern": "^[0-9a-f]{128}$",
        "description": "signer's Ed25519 signature over the ASCII bytes 'ftrain-event-v1:' followed by hash.",
    },
}
_ENVELOPE_FIELDS: dict[str, dict[str, Any]] = {
    "run_id": {"pattern": f"^{RUN_ID_PATTERN}$", "minLength": 1, "maxLength": RUN_ID_MAX},
    "seq": {"minimum": 1, "description": "Position in the run's chain, from 1."},
    "id": {"pattern": EVENT_ID, "description": "Also the message's Nats-Msg-Id."},
    "time": {"format": "date-time", "description": "RFC 3339, UTC."},
    "prev_hash": {"pattern": HEX64, "description": "The previous event's hash; 64 zeros for seq 1."},
}
_RESTART = (
    ' Its restart form: checkpoint_seq 0, step 0, epoch 0, uri "" and checkpoint_hash ""; a reader folding'
    " the chain rejects it in a run that has a checkpointed event."
)


def stored_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of a stored payload of any event type."""
    schema: dict[str, Any] = msgspec.json.schema(AnyEvent)
    defs: dict[str, Any] = schema["$defs"]
    for ref in schema.pop("discriminator")["mapping"].values():
        variant = defs[ref.removeprefix("#/$defs/")]
        properties: dict[str, Any] = variant["properties"]
        for name, extra in _ENVELOPE_FIELDS.items():
            properties[name] = {**properties[name], **extra}
        for name in ENVELOPE:
            properties.get(name, {}).pop("default", None)
        properties.update(_TRAILER)
        variant["required"] = [*ENVELOPE, *(r for r in variant["required"] if r not in ENVELOPE)]
        variant["dependentRequired"] = {"signer": ["sig"], "sig": ["signer"]}
    for digested in (Checkpointed, Snapshotted, SnapshotReplicated):
        defs[digested.__name__]["properties"]["checkpoint_hash"]["pattern"] = HEX64
    _restart_form(defs[Resumed.__name__])
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "ftrain stored event",
        "description": "One message payload of stream FTRAIN_EVENTS (subject ftrain.run.<run_id>.<type>).",
        **schema,
    }


def schema_text() -> str:
    """The schema as `ftrain events schema` prints it and the docs site serves it: indented JSON."""
    return msgspec.json.format(msgspec.json.encode(stored_schema())).decode()


def _restart_form(resumed: dict[str, Any]) -> None:
    """`resumed` names a checkpoint by seq and bare-hex hash, or (checkpoint_seq 0) none at all."""
    resumed["description"] = resumed["description"].replace("\n", " ") + _RESTART
    resumed["properties"]["checkpoint_hash"]["pattern"] = "^(?:[0-9a-f]{64})?$"
    resumed["if"] = {"properties": {"checkpoint_seq": {"const": 0}}}
    resumed["then"] = {
        "properties": {
            "step": {"const": 0},
            "epoch": {"const": 0},
            "uri": {"const": ""},
            "checkpoint_hash": {"const": ""},
        }
    }
    resumed["else"] = {"properties": {"checkpoint_hash": {"pattern": HEX64}}}
