"""What the log says about one run: its folded state and the checkpoints it recorded."""

from datetime import datetime
from typing import Literal

import msgspec
from msgspec import UnsetType

from ftrain.events.chain import ChainHead
from ftrain.events.schema import Checkpointed, Launched, PartReplicas, SnapshotPart, Snapshotted

RunStatus = Literal["running", "failed", "completed"]
ReplicaState = Literal["landed", "dropped", "pending", "none"]
CostUnit = Literal["GPU-hours", "CPU-hours", "node-hours"]


class CheckpointRef(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A checkpoint the log knows of: the `checkpointed` event that recorded it (the one struct that names a
    checkpoint's step, epoch, shards, URI, digest and size), and whether a resume has since refused it
    (`corrupt`) or a later `checkpointed` retired it (`pruned`: retention deleted it)."""

    recorded: Checkpointed
    status: Literal["valid", "corrupt", "pruned"] = "valid"
    reason: str | None = None

    @property
    def seq(self) -> int:
        """The per-run seq of the recording event: how the log names this checkpoint."""
        return self.recorded.seq

    @property
    def step(self) -> int:
        return self.recorded.step

    @property
    def epoch(self) -> int:
        return self.recorded.epoch

    @property
    def uri(self) -> str:
        return self.recorded.uri

    @property
    def checkpoint_hash(self) -> str:
        return self.recorded.checkpoint_hash

    @property
    def time(self) -> datetime:
        return self.recorded.time


class SnapshotRef(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The run's newest memory snapshot as the log knows it: the `snapshotted` event that recorded it, and
    whether a resume has since refused it (`corrupt`)."""

    recorded: Snapshotted
    status: Literal["valid", "corrupt"] = "valid"
    reason: str | None = None
    resumes: int = 0
    """The run's resume count when it was recorded: a later snapshot must advance past it until the run
    resumes again (from wherever: it may then snapshot earlier steps)."""
    replicas: tuple[PartReplicas, ...] | None = None
    """What its `snapshot_replicated` said of each node's replicas (None: the exchange has not ended, or the
    snapshot has no replicas: one node, or a writer from before replicas were recorded)."""

    def nodes(self) -> list["NodeCopy"]:
        """Each node's part of the snapshot and where its replica stands, in node order (empty: the event
        names no parts)."""
        parts = self.recorded.parts
        if not isinstance(parts, tuple):
            return []
        hosts = {p.node: p.host for p in parts}
        outcomes = {r.node: r for r in self.replicas or ()}
        return [
            NodeCopy(
                part=p,
                replica_host=None if p.replica_node is None else hosts.get(p.replica_node),
                replica=_replica_state(p.ranks, p.replica_node, outcomes.get(p.node), self.replicas),
                replicas=outcomes.get(p.node),
            )
            for p in parts
        ]


class NodeCopy(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One node's part of the newest memory snapshot, as `status` and the web view show it: the part as its
    `snapshotted` names it, the host of its replica node, and where its replica stands: `landed` (every
    rank's verified there), `dropped` (some rank's dropped or failed: `replicas` counts them), `pending`
    (the exchange has not ended) or `none` (a job of one node keeps no replica)."""

    part: SnapshotPart
    replica_host: str | None
    replica: ReplicaState
    replicas: PartReplicas | None = None


def _replica_state(
    ranks: int, replica_node: int | None, outcome: PartReplicas | None, ended: tuple[PartReplicas, ...] | None
) -> ReplicaState:
    if replica_node is None:
        return "none"
    if ended is None:
        return "pending"
    return "landed" if outcome is not None and outcome.landed == ranks else "dropped"


class RunState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Everything the log says about one run, folded from its events."""

    run_id: str
    project: str
    status: RunStatus
    launch: Launched
    head: ChainHead
    updated_at: datetime
    step: int = 0
    epoch: int = 0
    resume_count: int = 0
    failures: int = 0
    last_failure: str | None = None
    checkpoints: tuple[CheckpointRef, ...] = ()
    running_since: datetime | None = None
    running_seconds: float = 0.0
    cost_gpu_hours: float | None = None
    cost_source: str | None = None
    attempt: int = 0
    """The current attempt: `launched` opens 1, each `resumed` that opens one the next. Only the current
    attempt's processes may record; a zombie of an older one is refused."""
    fenced: bool = False
    """An attempt's process has recorded with its attempt: from then on one without (an old trainer) is
    refused too."""
    resumed_in: int = 0
    """The attempt of the last `resumed` (0: none yet), and the checkpoint it named (`resumed_hash`)."""
    resumed_hash: str | None = None
    hosts: tuple[str, ...] = ()
    """The nodes of the current attempt, when its `resumed` named them (empty: the launch's)."""
    gpu_seconds: float | None = None
    """GPU-seconds of the running stretches before the current one, each at its own world size (None: a state
    folded and stored by an older ftrain, when every attempt ran on the launch's nodes)."""
    resumed_mlflow_run_id: str | None = None
    """The MLflow run the newest `resumed` that named one continues (None: none did; see `mlflow_run_id`)."""
    snapshot: SnapshotRef | None = None
    """The newest memory snapshot the log accepted (None: none; a state stored before the memory tier)."""

    def memory_candidate(self) -> SnapshotRef | None:
        """The snapshot a resume may try before the durable tier: the newest, unless refused or no newer than
        the newest valid durable checkpoint (which is then as near, and survives a lost node)."""
        snapshot = self.snapshot
        if snapshot is None or snapshot.status != "valid":
            return None
        newest = next(iter(self.valid_checkpoints()), None)
        return snapshot if newest is None or snapshot.recorded.step > newest.step else None

    @property
    def mlflow_run_id(self) -> str | None:
        """The MLflow run every attempt continues: the one a relaunch named last, else the launch's."""
        return self.resumed_mlflow_run_id or self.launch.mlflow_run_id

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes the current attempt runs on."""
        return self.hosts or self.launch.hosts

    @property
    def gpus(self) -> int:
        """GPUs the current attempt holds: fewer than launched once an elastic relaunch dropped a node."""
        return (len(self.hosts) or self.launch.nodes) * self.launch.gpus_per_node

    def valid_checkpoints(self) -> list[CheckpointRef]:
        """Checkpoints neither known to be corrupt nor pruned, newest first."""
        return [c for c in reversed(self.checkpoints) if c.status == "valid"]

    def checkpoint(self, seq: int) -> CheckpointRef | None:
        """The checkpoint recorded by event `seq`."""
        return next((c for c in self.checkpoints if c.seq == seq), None)

    def running_seconds_at(self, moment: datetime) -> float:
        """Wall time spent running, counting the current attempt up to `moment`."""
        current = (moment - self.running_since).total_seconds() if self.running_since else 0.0
        return self.running_seconds + max(current, 0.0)

    def gpu_seconds_at(self, moment: datetime) -> float:
        """GPU-seconds spent running up to `moment`: each stretch at the world size it ran with."""
        current = (moment - self.running_since).total_seconds() if self.running_since else 0.0
        launched = self.launch.nodes * self.launch.gpus_per_node
        before = self.running_seconds * launched if self.gpu_seconds is None else self.gpu_seconds
        return before + max(current, 0.0) * self.gpus

    def gpu_hours_at(self, moment: datetime) -> float:
        """Reported cost once completed, else running wall time × GPUs of each attempt; 0 for a CPU job."""
        return self.cost_hours_at(moment) if self.cost_unit == "GPU-hours" else 0.0

    @property
    def cost_unit(self) -> CostUnit:
        """What the run is costed in, as launched: GPU-hours, or a CPU job's CPU-hours or node-hours."""
        if self.launch.devices != "cpu":
            return "GPU-hours"
        return "node-hours" if isinstance(self.launch.cpus_per_node, UnsetType) else "CPU-hours"

    def cost_hours_at(self, moment: datetime) -> float:
        """The cost in `cost_unit`: reported (or computed) once completed, else running wall time × the GPUs,
        CPUs or nodes of each attempt (`completed` holds it in `cost_gpu_hours`, whatever the unit)."""
        if self.cost_gpu_hours is not None:
            return self.cost_gpu_hours
        launch = self.launch
        per_node = launch.gpus_per_node if launch.devices != "cpu" else launch.cpus_per_node or 1
        return self.gpu_seconds_at(moment) / launch.gpus_per_node * per_node / 3600.0
