"""Intents: what a trainer or supervisor wants recorded, kept in the local outbox until the log has it.

An intent names a transition by what the writer knows (a checkpoint's digest, a step), never by the log's
position: the position is decided when the log is reachable, against the run's state then
(`domain.lifecycle.deciders.decide_intent`). Each carries the attempt of the process that wants it
(0: an old outbox row), so an intent of an attempt that has since been superseded is refused.
"""

import msgspec

from ftrain.events.schema import Checkpointed, DataPosition, SnapshotReplicated, Snapshotted, Tier


class CheckpointIntent(msgspec.Struct, frozen=True, kw_only=True, tag="checkpoint"):
    """A checkpoint was finalized (manifest + marker in place): record this `checkpointed` event."""

    checkpointed: Checkpointed


class SnapshotIntent(msgspec.Struct, frozen=True, kw_only=True, tag="snapshot"):
    """A memory snapshot is complete on every rank: record this `snapshotted` event."""

    snapshotted: Snapshotted


class ReplicaIntent(msgspec.Struct, frozen=True, kw_only=True, tag="replica"):
    """A memory snapshot's replica exchange has ended: record this `snapshot_replicated` event (its
    `snapshot_seq` decided against the log: the `snapshotted` event with its digest)."""

    snapshot_replicated: SnapshotReplicated


class SkipIntent(msgspec.Struct, frozen=True, kw_only=True, tag="skip"):
    """The checkpoint with this manifest digest failed verification: record `corrupt_skipped`."""

    checkpoint_hash: str
    step: int
    reason: str
    tier: Tier | None = None
    """`memory`: the run's memory snapshot with this digest (None: a durable checkpoint)."""


class ResumeIntent(msgspec.Struct, frozen=True, kw_only=True, tag="resume"):
    """Training restarted from the checkpoint with this digest (None: from step 0, none ever existed)."""

    checkpoint_hash: str | None
    step: int
    attempt: int = 0
    saved_world: int | None = None
    """The ranks that saved the checkpoint, and those that resumed it (None: not said)."""
    world: int | None = None
    data: DataPosition | None = None
    """The global data position resumed from (None: the loader keeps none)."""
    tier: Tier | None = None
    """`memory`: resumed from the run's memory snapshot with this digest (None: a durable checkpoint)."""


class FailIntent(msgspec.Struct, frozen=True, kw_only=True, tag="fail"):
    """The training job stopped abnormally: record `failed`."""

    reason: str
    exit_code: int | None = None
    message: str = ""
    attempt: int = 0


class CompleteIntent(msgspec.Struct, frozen=True, kw_only=True, tag="complete"):
    """The training job finished: record `completed` (GPU-hours reported, or wall time × GPUs when None)."""

    cost_gpu_hours: float | None = None
    attempt: int = 0


Intent = (
    CheckpointIntent
    | SnapshotIntent
    | ReplicaIntent
    | SkipIntent
    | ResumeIntent
    | FailIntent
    | CompleteIntent
)
