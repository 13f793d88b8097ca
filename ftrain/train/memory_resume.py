"""Resume from the memory tier: the nearest verified copy, tried before the durable checkpoints.

Rank 0 names the candidate from the log (`RunState.memory_candidate`: the run's newest snapshot the log
accepted, not refused, newer than every valid durable checkpoint). Every rank judges, on its node, the copies
of the parts it needs (its own rank's on the snapshot's world size; every rank's on another: DCP reshards)
against that event's digest (`workers.memory_tier.judge`: the manifest's digest, then each of its files,
hashed), its own directory first, else a replica its node holds (the job back on fewer nodes). What every
rank found decides the route alike on each (`memory_route`): served from memory, parts sent back from their
buddies' replicas first (`peer_resume`, then decided again: `tier: peer`), a defect recorded as
`corrupt_skipped` against its tier, or the snapshot unavailable to this world (nothing recorded; the durable
tier serves). Served, each rank loads its parts with DCP, alone, as one checkpoint (`merged_metadata`), each
`.metadata` parsed only once its bytes matched, every pickle through the allowlist (the durable resume's
reader and planner); rank 0 then records `resumed` with the tier.
"""

from typing import TypeVar

import structlog
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from ftrain.domain.lifecycle import ResumeIntent, SkipIntent, SnapshotRef, resumed_line, skipped_line
from ftrain.events.schema import Snapshotted, Tier
from ftrain.train.memory_route import KINDS, Copy, Fetch, Serve, Skip, Unavailable, needed, route
from ftrain.train.peer_resume import fetch_replicas
from ftrain.train.resume_load import world_change_refusal
from ftrain.train.snapshots import MemoryTier
from ftrain.train.state import TrainState
from ftrain.workers.dcp_reader import RestrictedLoadPlanner, VerifiedReader, load_metadata
from ftrain.workers.manifest import Manifest
from ftrain.workers.memory_tier import SnapshotUnavailable, judge, local_entries, snapshot_dir
from ftrain.workers.merged_metadata import merged
from ftrain.workers.recorder import Recording
from ftrain.workers.storage.storage_errors import StorageUnavailable
from ftrain.workers.unpickle import RefusedPickle

log = structlog.get_logger(__name__)
T = TypeVar("T")
Verdict = SnapshotUnavailable | str | None
"""One rank's judgement of its part: unavailable, why it is corrupt, or None (clean)."""


def resume_from_memory(
    tier: MemoryTier,
    candidate: SnapshotRef,
    state: TrainState,
    recorder: Recording | None,
    attempt: int,
    run_name: str,
) -> bool:
    """Every rank: load the snapshot of `candidate` (the same on every rank) into `state` when every rank's
    part is there and verified; whether it was loaded. Rank 0 records the outcome (see the module)."""
    snap = candidate.recorded
    verdict, via = _loaded(tier, snap, run_name, state, attempt)
    if verdict is None:
        if tier.rank == 0:
            resumed = ResumeIntent(
                checkpoint_hash=snap.checkpoint_hash,
                step=state.step,
                attempt=attempt,
                saved_world=snap.shards,
                world=tier.world,
                data=state.data.position.position() if state.data and state.data.position else None,
                tier=via,
            )
            if recorder is not None:
                recorder.record(resumed)
            print(resumed_line(resumed, state.epoch), flush=True)
        tier.newest = snap.step
        return True
    if tier.rank == 0:
        if isinstance(verdict, SnapshotUnavailable):
            log.warning("memory_snapshot_unavailable", step=snap.step, reason=verdict.reason)
            print(f"memory snapshot step {snap.step} unavailable ({verdict.reason}) → durable", flush=True)
        else:
            if recorder is not None:
                recorder.record(
                    SkipIntent(checkpoint_hash=snap.checkpoint_hash, step=snap.step, reason=verdict, tier=via)
                )
            print(skipped_line(snap.step, f"({via}) {verdict}"), flush=True)
    return False


def _loaded(
    tier: MemoryTier, snap: Snapshotted, run_name: str, state: TrainState, attempt: int
) -> tuple[Verdict, Tier]:
    """The route every rank takes (`memory_route`, from every rank's copies on its node), and the tier it
    came from; when served, each rank's parts loaded (a failure of the load combined alike). The same on
    every rank."""
    step, expected, saved = snap.step, snap.checkpoint_hash, snap.shards
    if refusal := world_change_refusal(state.data, saved, tier.world, step):
        return SnapshotUnavailable(refusal), "memory"  # the same on every rank; the durable tier says it
    manifest, mine = _found(tier, step, expected, run_name, saved)
    found = _every(mine, tier)
    decision = route(saved, tier.world, found)
    if isinstance(decision, Fetch):
        if tier.buddy is None or not fetch_replicas(
            tier, step, expected, run_name, list(decision.missing), attempt
        ):
            decision = route(saved, tier.world, found, fetched=True)
        else:
            manifest, mine = _found(tier, step, expected, run_name, saved)
            decision = route(saved, tier.world, _every(mine, tier), fetched=True)
    if isinstance(decision, Skip):
        return decision.reason, decision.tier
    if isinstance(decision, Unavailable):
        return SnapshotUnavailable(decision.reason), "memory"
    assert (
        isinstance(decision, Serve) and manifest is not None
    )  # every rank found every part it needs verified
    return _load(tier, step, manifest, mine, state, decision.reshard), decision.tier


def _found(
    tier: MemoryTier, step: int, expected: str, run_name: str, saved: int
) -> tuple[Manifest | None, list[Copy]]:
    """The copies on this rank's node of the parts it needs (`memory_route.needed`), its own directory's
    first, each judged against the log's digest; the manifest, when one verified. A copy never completed
    or unreadable here is not listed (unavailable, not corrupt)."""
    manifest: Manifest | None = None
    copies: list[Copy] = []
    for source in needed(tier.rank, saved, tier.world):
        for kind in KINDS:
            judged = judge(tier.root, step, source, expected, run_name, replica=kind == "replica")
            if isinstance(judged, SnapshotUnavailable):
                continue
            if isinstance(judged, Manifest):
                manifest = judged
            copies.append(Copy(source, kind, judged if isinstance(judged, str) else None))
            break
    return manifest, copies


def _load(
    tier: MemoryTier, step: int, manifest: Manifest, copies: list[Copy], state: TrainState, reshard: bool
) -> Verdict:
    """This rank's verified parts loaded into `state`, as one checkpoint (`merged_metadata`: on another
    world, DCP reshards); the verdicts on the load, combined."""
    path = snapshot_dir(tier.root, step)
    parts: list[tuple[str, Metadata]] = []
    failure: Verdict = None
    for copy in copies:
        try:
            metadata = load_metadata(path / copy.directory, local_entries(manifest, copy.source))
        except StorageUnavailable as exc:
            failure = SnapshotUnavailable(str(exc))
            break
        if isinstance(metadata, str):
            failure = f"{copy.directory}: {metadata}"
            break
        parts.append((copy.directory, metadata))
    whole = merged(parts) if failure is None else None
    if isinstance(whole, str):
        failure = whole
    if (verdict := _combined(failure, tier)) is not None:
        return verdict
    assert isinstance(whole, Metadata)
    state.restore_rng = not reshard  # per-rank RNG streams exist for the ranks that saved
    try:
        dcp_load(
            {"app": state},
            storage_reader=VerifiedReader(path, whole),
            planner=RestrictedLoadPlanner(),
            no_dist=True,
        )
    except (CheckpointException, RefusedPickle) as exc:
        failure = str(exc)
    except OSError as exc:
        failure = SnapshotUnavailable(f"{type(exc).__name__}: {exc}")
    finally:
        state.restore_rng = True
    return _combined(failure, tier)


def _combined(verdict: Verdict, tier: MemoryTier) -> Verdict:
    """Every rank's verdict, the same on each: a corrupt part first (it is recorded), else an unavailable
    one, else None."""
    return _worst(_every(verdict, tier))


def _every(value: T, tier: MemoryTier) -> list[T]:
    """Every rank's `value`, in rank order, on every rank."""
    every: list[T] = [value] * tier.world
    dist.all_gather_object(every, value, group=tier.group)
    return every


def _worst(every: list[Verdict]) -> Verdict:
    """A corrupt part first (it is recorded), else an unavailable one, else None."""
    corrupt = next((v for v in every if isinstance(v, str)), None)
    return corrupt if corrupt is not None else next((v for v in every if v is not None), None)
