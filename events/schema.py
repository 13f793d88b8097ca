"""The event schema: one frozen msgspec struct per lifecycle transition, a tagged union on `type`.

Stream consumers decode these from the JSON payload of `ftrain.run.<run_id>.<type>`; unknown fields are
ignored on decode, so adding a field never breaks an older reader (and never an old hash: hashes are over
the stored bytes, see `events.chain`).
"""

import typing
from datetime import UTC, datetime
from typing import Literal

import msgspec

EVENT_TYPES = ("launched", "checkpointed", "failed", "resumed", "corrupt_skipped", "completed")
FAILURE_REASONS: tuple[str, ...] = ("preempted", "node-failure", "oom", "exit-code", "signal", "unknown")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Actor(msgspec.Struct, frozen=True):
    """Who appended the event: user@host, process, and training rank when a trainer did."""

    user: str
    host: str
    pid: int
    rank: int | None = None


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Fields every event carries. `seq`, `id`, `time`, `actor` and `prev_hash` are stamped at append."""

    run_id: str
    seq: int = 0
    id: str = ""
    time: datetime = EPOCH
    actor: Actor | None = None
    prev_hash: str = ""


class CheckpointPolicy(msgspec.Struct, frozen=True):
    """How often the trainer checkpoints: every `seconds` of wall time and/or every `steps` steps."""

    text: str
    seconds: float | None = None
    steps: int | None = None


class Launched(Event, frozen=True, kw_only=True, tag="launched"):
    """A run was launched; carries everything needed to relaunch it."""

    project: str
    strategy: str
    nodes: int
    gpus_per_node: int
    hosts: tuple[str, ...]
    allocation_source: str
    rdzv_endpoint: str
    command: tuple[str, ...]
    storage: str
    dataset_revision: str | None = None
    checkpoint_policy: CheckpointPolicy | None = None
    mlflow_run_id: str | None = None


class Checkpointed(Event, frozen=True, kw_only=True, tag="checkpointed"):
    """A complete checkpoint exists at `uri`; `checkpoint_hash` is the SHA-256 of its canonical manifest."""

    step: int
    epoch: int
    shards: int
    uri: str
    checkpoint_hash: str
    size_bytes: int
    attempt: int = 0
    """The attempt that wrote it (0: written before attempts existed, or by no attempt's process)."""


class Failed(Event, frozen=True, kw_only=True, tag="failed"):
    """The run stopped abnormally (preemption, node loss, OOM, non-zero exit)."""

    reason: str
    exit_code: int | None = None
    message: str = ""
    attempt: int = 0


class Resumed(Event, frozen=True, kw_only=True, tag="resumed"):
    """The run restarts from the checkpointed event `checkpoint_seq` (its newest valid checkpoint), or from
    step 0 when `checkpoint_seq` is 0: legal only for a run that never recorded a checkpoint."""

    checkpoint_seq: int
    step: int
    epoch: int
    uri: str
    checkpoint_hash: str
    resume_count: int
    forced: bool = False
    command: tuple[str, ...] = ()
    attempt: int = 0
    """The attempt it opens (the current one + 1), or continues (the current one: a trainer that fell back
    to an older checkpoint, or whose workers its launcher restarted in place); 0: opens the next (old logs)."""


class CorruptSkipped(Event, frozen=True, kw_only=True, tag="corrupt_skipped"):
    """The checkpoint of event `checkpoint_seq` failed verification and will never be resumed from."""

    checkpoint_seq: int
    step: int
    uri: str
    reason: str


class Completed(Event, frozen=True, kw_only=True, tag="completed"):
    """The run finished; no event may follow."""

    cost_gpu_hours: float
    running_seconds: float
    cost_source: Literal["reported", "wall-time"]
    attempt: int = 0


AnyEvent = Launched | Checkpointed | Failed | Resumed | CorruptSkipped | Completed

_TYPES: dict[type, str] = {cls: str(cls.__struct_config__.tag) for cls in typing.get_args(AnyEvent)}
_decoder = msgspec.json.Decoder(AnyEvent)
_encoder = msgspec.json.Encoder()


def event_type(event: AnyEvent) -> str:
    """The event's `type` tag (a dict lookup: reading `__struct_config__` builds an object each time)."""
    return _TYPES[type(event)]


def encode_event(event: AnyEvent) -> bytes:
    """The canonical bytes of an event: the only place event bytes are produced."""
    return _encoder.encode(event)


def decode_event(data: bytes) -> AnyEvent:
    """Decode an event payload; raises msgspec.DecodeError / ValidationError on malformed input."""
    event: AnyEvent = _decoder.decode(data)
    return event


def json_schema() -> dict[str, object]:
    """The JSON Schema of every event type, for stream consumers."""
    return msgspec.json.schema(AnyEvent)


def now() -> datetime:
    """Wall-clock time for event stamps, always UTC."""
    return datetime.now(UTC)
