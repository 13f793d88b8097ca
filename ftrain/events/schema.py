"""The event schema: one frozen msgspec struct per lifecycle transition, a tagged union on `type`.

Stream consumers decode these from the JSON payload of `ftrain.run.<run_id>.<type>`; unknown fields are
ignored on decode, so adding a field never breaks an older reader (and never an old hash: hashes are over
the stored bytes, see `events.chain`).
"""

import typing
from datetime import UTC, datetime
from typing import Annotated, Literal, get_args

import msgspec
from msgspec import UNSET, UnsetType

EVENT_TYPES = (
    "launched", "checkpointed", "snapshotted", "snapshot_replicated", "failed", "resumed", "corrupt_skipped",
    "completed",
)  # fmt: skip
Tier = Literal["memory", "peer"]
"""Where a copy of the state lives, when not in durable storage: `memory`, node-local memory (a private
tmpfs that outlives the trainer process); `peer`, the same snapshot, some ranks' parts sent back from the
replicas their buddies' nodes held. Unset on an event: the durable tier, as every log before tiers."""
SNAPSHOT_TIERS: tuple[Tier, ...] = get_args(Tier)
"""The tiers whose copies are the run's memory snapshot."""
FAILURE_REASONS: tuple[str, ...] = (
    "preempted", "node-failure", "oom", "exit-code", "signal", "unknown",
    "lost",  # its supervisor stopped renewing its lease (recorded by the relaunch that took it over)
    "hang",  # no rank made progress for --hang-timeout (recorded by the supervisor's watchdog)
    "setup",  # the supervisor could not set up the attempt the log opened (its fence, progress, process)
)  # fmt: skip
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The bounds of every number an event carries: SQLite and every consumer hold integers as int64, and a
# number outside a bound is refused at append and reported as a finding when read (never an overflow).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 1_024
MAX_CPUS_PER_NODE = 65_536
MAX_SHARDS = MAX_NODES * MAX_GPUS_PER_NODE
MAX_AMOUNT = 1e12  # GPU-hours, seconds: far beyond any real run, finite
MAX_EVENT_BYTES = 512 * 1024  # half the server's 1 MiB payload limit: the seal and headers must fit too
MAX_SNAPSHOT_PARTS = 2_048
"""The most nodes whose parts a `snapshotted` (and its `snapshot_replicated`) names one by one: a job on more
records its snapshot without them. At most about 170 bytes a part, well within MAX_EVENT_BYTES."""
HOST_MAX = 64  # Linux's HOST_NAME_MAX

Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
RETIRED_MAX: typing.Final = 64
"""The most steps one `checkpointed` retires (a run upgraded with many old checkpoints retires them over
several saves)."""
Nodes = Annotated[int, msgspec.Meta(ge=1, le=MAX_NODES)]
GpusPerNode = Annotated[int, msgspec.Meta(ge=1, le=MAX_GPUS_PER_NODE)]
Shards = Annotated[int, msgspec.Meta(ge=1, le=MAX_SHARDS)]
ExitCode = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
Amount = Annotated[float, msgspec.Meta(ge=0, le=MAX_AMOUNT)]


class InvalidEvent(ValueError):
    """An event that breaks the schema's bounds (a number out of range, not finite, or too large a payload)."""


class Actor(msgspec.Struct, frozen=True, gc=False):
    """Who recorded the event: user@host, process, and training rank when a trainer did. An intent kept in a
    node's outbox carries the process that recorded it, whichever process of the node delivers it."""

    user: str
    host: str
    pid: Count
    rank: Count | None = None


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", gc=False):
    """Fields every event carries. `seq`, `id`, `time`, `actor` and `prev_hash` are stamped at append."""

    run_id: str
    seq: Count = 0
    id: str = ""
    time: datetime = EPOCH
    actor: Actor | None = None
    prev_hash: str = ""


class CheckpointPolicy(msgspec.Struct, frozen=True, gc=False):
    """How often the trainer checkpoints: every `seconds` of wall time and/or every `steps` steps."""

    text: str
    seconds: Amount | None = None
    steps: Count | None = None


class DataPosition(msgspec.Struct, frozen=True, gc=False):
    """Where a run stands in its global sample stream, on any world size: the epoch, the samples of it already
    trained, every sample trained since the run began, and the seed of the epochs' permutations."""

    epoch: Count
    offset: Count
    consumed: Count
    seed: Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]


class SchedulerJob(msgspec.Struct, frozen=True, gc=False):
    """The batch job a supervisor ran in: `slurm` or `pbs`, its id (which survives a requeue), how many
    times the scheduler had requeued it (Slurm's SLURM_RESTART_COUNT; None: the scheduler does not say), the
    cluster it ran on (Slurm's SLURM_CLUSTER_NAME; None: not given, or PBS, whose id names its server), and
    when this start of it began (`scontrol show job`'s StartTime, as shown; None: unknown). Together they
    tell a requeue (same id and cluster, more restarts) or the same job start (same restarts and start time)
    from a new job with a recycled id."""

    scheduler: Annotated[str, msgspec.Meta(max_length=16)]
    id: Annotated[str, msgspec.Meta(max_length=256)]
    restarts: Count | None = None
    cluster: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    started: Annotated[str, msgspec.Meta(max_length=32)] | None = None


class Launched(Event, frozen=True, kw_only=True, tag="launched"):
    """A run was launched; carries everything needed to relaunch it."""

    project: str
    strategy: str
    nodes: Nodes
    gpus_per_node: GpusPerNode
    hosts: tuple[str, ...]
    allocation_source: str
    rdzv_endpoint: str
    command: tuple[str, ...]
    storage: str
    dataset_revision: str | None = None
    checkpoint_policy: CheckpointPolicy | None = None
    mlflow_run_id: str | None = None
    devices: Literal["cpu"] | UnsetType = UNSET
    """`cpu`: a CPU job, `gpus_per_node` counting its processes per node, costed in node-hours (CPU-hours
    with `cpus_per_node`); unset: one GPU per process, costed in GPU-hours (every log before CPU jobs)."""
    cpus_per_node: Annotated[int, msgspec.Meta(ge=1, le=MAX_CPUS_PER_NODE)] | UnsetType = UNSET
    job: SchedulerJob | UnsetType = UNSET
    """The scheduler's job `ftrain run` launched it in; unset outside one (and in older logs)."""


class StateCopy(Event, frozen=True, kw_only=True):
    """What every record of a complete copy of the job's state says: the step and epoch it holds, the ranks
    that wrote it, where it is, the SHA-256 of its canonical manifest, its bytes and the attempt that wrote
    it (0: written before attempts existed, or by no attempt's process)."""

    step: Count
    epoch: Count
    shards: Shards
    uri: str
    checkpoint_hash: str
    size_bytes: Count
    attempt: Count = 0


class Checkpointed(StateCopy, frozen=True, kw_only=True, tag="checkpointed"):
    """A complete checkpoint exists at `uri`; `checkpoint_hash` is the SHA-256 of its canonical manifest."""

    # What the trainer measured for goodput (`projections.goodput`). Unset (absent from the payload) when the
    # writer did not measure it: an operator's `ftrain checkpoint`, a trainer from before goodput.
    stall_seconds: Amount | UnsetType = UNSET
    """How long saves held the training loop since the attempt's previous `checkpointed`: this save's (a sync
    save from its start to this event, an async one its copy to host memory plus its wait for the previous),
    and what earlier saves held it after their events or without one (recording, pruning, a failed save)."""
    train_seconds: Amount | UnsetType = UNSET
    """The attempt's training before this save: its loop's time from its start, less earlier saves' stalls."""
    loop_seconds: Amount | UnsetType = UNSET
    """Seconds from the attempt's training-loop start (start-up and restore done) to this event's `time`."""
    lost_steps: Count | UnsetType = UNSET
    """Steps the previous attempt had trained past the checkpoint this attempt resumed from (re-done here)."""
    lost_seconds: Amount | UnsetType = UNSET
    """The training-loop time the previous attempt spent on those steps, as its metrics timed them."""
    retired: Annotated[tuple[Count, ...], msgspec.Meta(max_length=RETIRED_MAX)] | UnsetType = UNSET
    data: DataPosition | UnsetType = UNSET
    """The global data position of the saved state, when its loader keeps one (absent otherwise)."""
    """The steps of earlier checkpoints retention deletes now that this one is sealed (deleted only after this
    event was recorded): those the log then shows `pruned`. Unset (absent) when it retires none, or written by
    a trainer from before retention named them. At most RETIRED_MAX: the oldest first, the rest next time."""


class SnapshotPart(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One node's part of a memory snapshot: the node (its rank among the job's nodes, and its host name),
    the ranks whose state it holds (`ranks` of them from `first_rank`), their bytes, and the node its replica
    goes to (None: a job of one node keeps no replica)."""

    node: Count
    host: Annotated[str, msgspec.Meta(max_length=HOST_MAX)]
    first_rank: Count
    ranks: Shards
    size_bytes: Count
    replica_node: Count | None = None


class Snapshotted(StateCopy, frozen=True, kw_only=True, tag="snapshotted"):
    """A verified snapshot of the whole job's state exists in node-local memory (the memory tier, under the
    durable one): each rank's files on its own node, `checkpoint_hash` the SHA-256 of the canonical manifest
    that lists every rank's files with their digests, so a resume verifies each byte against this event.

    Its own type, not a `checkpointed` with a tier: a snapshot is never a checkpoint of the durable tier
    (it neither advances the run's step, nor takes part in retention, `ftrain verify`, export or the
    relaunch's choice), and it lives and dies with its node. Only the newest one counts. Its `uri` is rank
    0's snapshot directory on its node (what an operator looks at; each rank's resume finds its own)."""

    parts: Annotated[tuple[SnapshotPart, ...], msgspec.Meta(max_length=MAX_SNAPSHOT_PARTS)] | UnsetType = (
        UNSET
    )
    """Where each node's part lives, in node order; unset: written before parts were named, or a job on more
    than MAX_SNAPSHOT_PARTS nodes."""

    train_seconds: Amount | UnsetType = UNSET
    """The attempt's training before this snapshot (its loop's time, less every stall), as on `checkpointed`:
    what a resume from it keeps, for goodput. Unset when the writer did not measure it (older trainers)."""


class PartReplicas(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What became of the replicas of one node's part (`node`, as its `SnapshotPart` names it) on its replica
    node: how many of its ranks' replicas landed there verified and sealed, how many arrived but did not match
    the manifest (`dropped`), how many never arrived whole (`failed`: a peer gone, a full tmpfs)."""

    node: Count
    landed: Count
    dropped: Count = 0
    failed: Count = 0


class SnapshotReplicated(Event, frozen=True, kw_only=True, tag="snapshot_replicated"):
    """The replica exchange of the memory snapshot of the `snapshotted` event `snapshot_seq` (its `step` and
    `checkpoint_hash`) has ended: per node, which of its parts' replicas landed on the next node.

    Its own event, after `snapshotted`: the snapshot is recorded as soon as every part is sealed (a kill
    during the exchange still finds it in the log), and the exchange may take long on a slow link. It changes
    nothing a resume decides: a peer resume verifies every replica against the manifest whatever this says;
    it is what `status`, the web view and an auditor see of where the copies are."""

    snapshot_seq: Count
    step: Count
    checkpoint_hash: str
    replicas: Annotated[tuple[PartReplicas, ...], msgspec.Meta(max_length=MAX_SNAPSHOT_PARTS)]
    attempt: Count = 0


class Failed(Event, frozen=True, kw_only=True, tag="failed"):
    """The run stopped abnormally (preemption, node loss, OOM, non-zero exit)."""

    reason: str
    exit_code: ExitCode | None = None
    message: str = ""
    attempt: Count = 0


class Resumed(Event, frozen=True, kw_only=True, tag="resumed"):
    """The run restarts from the checkpointed event `checkpoint_seq` (its newest valid checkpoint), or from
    step 0 when `checkpoint_seq` is 0: legal only for a run that never recorded a checkpoint."""

    checkpoint_seq: Count
    step: Count
    epoch: Count
    uri: str
    checkpoint_hash: str
    resume_count: Count
    forced: bool = False
    command: tuple[str, ...] = ()
    attempt: Count = 0
    """The attempt it opens (the current one + 1), or continues (the current one: a trainer that fell back
    to an older checkpoint, or whose workers its launcher restarted in place); 0: opens the next (old logs)."""
    hosts: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_NODES)] | UnsetType = UNSET
    """The nodes the attempt it opens runs on, when a supervisor opened it (an elastic relaunch may drop a lost
    node or take it back, a relaunch name more nodes or fewer: its world is `len(hosts) × gpus_per_node`);
    unset: the launch's nodes, as before (old logs, or a trainer continuing its own attempt)."""
    job: SchedulerJob | UnsetType = UNSET
    """The scheduler's job the supervisor that opened the attempt ran in (a requeued job: the same id, one more
    restart); unset outside one, or when a trainer continues its own attempt."""
    mlflow_run_id: str | UnsetType = UNSET
    """The MLflow run the attempt it opens continues (its `MLFLOW_RUN_ID`), when a supervisor opened it under
    one; unset: the launch's `mlflow_run_id` (old logs, or a run with no MLflow run)."""
    saved_world: Shards | UnsetType = UNSET
    """The ranks that saved the checkpoint resumed from (recorded by the trainer, or by a supervisor opening the
    attempt: the checkpoint's shards); unset in old logs."""
    world: Shards | UnsetType = UNSET
    """The ranks that resumed it (a supervisor: the attempt's nodes × `gpus_per_node`)."""
    data: DataPosition | UnsetType = UNSET
    """The global data position resumed from, when the saving loader kept one."""
    tier: Tier | UnsetType = UNSET
    """`memory`: resumed from the `snapshotted` event `checkpoint_seq` (node-local memory); unset: from a
    durable checkpoint (every log before tiers)."""


class CorruptSkipped(Event, frozen=True, kw_only=True, tag="corrupt_skipped"):
    """The checkpoint of event `checkpoint_seq` failed verification and will never be resumed from."""

    checkpoint_seq: Count
    step: Count
    uri: str
    reason: str
    tier: Tier | UnsetType = UNSET
    """`memory`: the snapshot of the `snapshotted` event `checkpoint_seq` failed; unset: a durable checkpoint."""


class Completed(Event, frozen=True, kw_only=True, tag="completed"):
    """The run finished; no event may follow."""

    cost_gpu_hours: Amount
    running_seconds: Amount
    cost_source: Literal["reported", "wall-time"]
    attempt: Count = 0


AnyEvent = (
    Launched | Checkpointed | Snapshotted | SnapshotReplicated | Failed | Resumed | CorruptSkipped | Completed
)

_TYPES: dict[type, str] = {cls: str(cls.__struct_config__.tag) for cls in typing.get_args(AnyEvent)}
_decoder = msgspec.json.Decoder(AnyEvent)
_encoder = msgspec.json.Encoder()


def event_type(event: AnyEvent) -> str:
    """The event's `type` tag (a dict lookup: reading `__struct_config__` builds an object each time)."""
    return _TYPES[type(event)]


def encode_event(event: AnyEvent) -> bytes:
    """The canonical bytes of an event: the only place event bytes are produced, so the only place that
    needs to refuse what a reader would: the bytes are decoded back, which applies every bound (a NaN or
    an infinity encodes as null and fails too). Raises InvalidEvent."""
    try:
        data = _encoder.encode(event)
    except UnicodeEncodeError as exc:
        raise InvalidEvent(
            f"{event_type(event)} event holds text that is not valid Unicode ({exc.reason})"
        ) from None
    if len(data) > MAX_EVENT_BYTES:
        raise InvalidEvent(f"{event_type(event)} event of {len(data)} bytes exceeds {MAX_EVENT_BYTES}")
    try:
        _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise InvalidEvent(f"{event_type(event)} event out of bounds: {exc}") from None
    return data


def decode_event(data: bytes) -> AnyEvent:
    """Decode an event payload; raises msgspec.DecodeError / ValidationError on malformed input."""
    event: AnyEvent = _decoder.decode(data)
    return event


def now() -> datetime:
    """Wall-clock time for event stamps, always UTC."""
    return datetime.now(UTC)
