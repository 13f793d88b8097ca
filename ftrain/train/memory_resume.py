"""Resume from the memory tier: the nearest verified copy, tried before the durable checkpoints.

Rank 0 names the candidate from the log (`RunState.memory_candidate`: the run's newest snapshot the log
accepted, not refused, newer than every valid durable checkpoint) and every rank judges its own part on its
node against that event's digest (`workers.memory_tier.judge`: the manifest's digest, then each of its files,
hashed). The verdicts are combined so every rank takes the same way: a rank whose part is not there (never
completed on its node, the node lost it, another world) makes every rank use the durable tier, recording
nothing against the snapshot; a part whose bytes do not match makes every rank skip it, rank 0 recording
`corrupt_skipped` with `tier: memory`. Only when every part is clean does each rank load its own part with
DCP, alone, `.metadata` parsed only once its bytes matched, every pickle through the allowlist (the durable
resume's reader and planner); rank 0 then records `resumed` with `tier: memory`.

On a job of several nodes, where some ranks' parts are not on their nodes (a node lost whole) but every one
of them has a verified replica on its buddy's node, those parts are sent back first (`peer_resume`), judged
again on arrival as any part, and the outcome is recorded with `tier: peer`.
"""

import structlog
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from ftrain.domain.lifecycle import ResumeIntent, SkipIntent, SnapshotRef, resumed_line, skipped_line
from ftrain.events.schema import Tier
from ftrain.train.peer_resume import fetch_replicas
from ftrain.train.snapshots import MemoryTier
from ftrain.train.state import TrainState
from ftrain.workers.dcp_reader import RestrictedLoadPlanner, VerifiedReader, load_metadata
from ftrain.workers.manifest import Manifest
from ftrain.workers.memory_tier import SnapshotUnavailable, judge, local_entries, rank_dir
from ftrain.workers.recorder import Recording
from ftrain.workers.storage.storage_errors import StorageUnavailable
from ftrain.workers.unpickle import RefusedPickle

log = structlog.get_logger(__name__)
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
    verdict, via = _loaded(tier, snap.step, snap.checkpoint_hash, run_name, state, attempt)
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
    tier: MemoryTier, step: int, expected: str, run_name: str, state: TrainState, attempt: int
) -> tuple[Verdict, Tier]:
    """Every rank's verdict on its part, combined, and the tier it came from (`peer`: some part was sent
    back from its replica); when all are clean, each rank's part loaded (a failure of the load combined the
    same way). The same on every rank."""
    manifest, mine = _judged(tier, step, expected, run_name)
    every = _every(mine, tier)
    missing = [r for r, v in enumerate(every) if isinstance(v, SnapshotUnavailable)]
    via: Tier = "memory"
    if (
        missing
        and tier.buddy is not None
        and not any(isinstance(v, str) for v in every)
        and fetch_replicas(tier, step, expected, run_name, missing, attempt)
    ):
        via = "peer"
        manifest, mine = _judged(tier, step, expected, run_name)
        every = _every(mine, tier)
    if (verdict := _worst(every)) is not None or manifest is None:
        return verdict, via
    return _load(tier, step, manifest, state), via


def _judged(tier: MemoryTier, step: int, expected: str, run_name: str) -> tuple[Manifest | None, Verdict]:
    """This rank's part on its node: its manifest when clean, else its verdict."""
    judged = judge(tier.root, step, tier.rank, expected, run_name)
    if not isinstance(judged, Manifest):
        return None, judged
    if judged.world_size != tier.world:
        return None, SnapshotUnavailable(f"saved by {judged.world_size} ranks, resumed by {tier.world}")
    return judged, None


def _load(tier: MemoryTier, step: int, manifest: Manifest, state: TrainState) -> Verdict:
    """Each rank's clean part loaded into `state`; the verdicts on the load, combined."""
    path = rank_dir(tier.root, step, tier.rank)
    failure: Verdict = None
    try:
        metadata = load_metadata(path, local_entries(manifest, tier.rank))
    except StorageUnavailable as exc:
        metadata = None
        failure = SnapshotUnavailable(str(exc))
    if isinstance(metadata, str):
        failure = metadata
    if (verdict := _combined(failure, tier)) is not None:
        return verdict
    assert isinstance(metadata, Metadata)
    try:
        dcp_load(
            {"app": state},
            storage_reader=VerifiedReader(path, metadata),
            planner=RestrictedLoadPlanner(),
            no_dist=True,
        )
    except (CheckpointException, RefusedPickle) as exc:
        failure = str(exc)
    except OSError as exc:
        failure = SnapshotUnavailable(f"{type(exc).__name__}: {exc}")
    return _combined(failure, tier)


def _combined(verdict: Verdict, tier: MemoryTier) -> Verdict:
    """Every rank's verdict, the same on each: a corrupt part first (it is recorded), else an unavailable
    one, else None."""
    return _worst(_every(verdict, tier))


def _every(verdict: Verdict, tier: MemoryTier) -> list[Verdict]:
    """Every rank's verdict, in rank order, on every rank."""
    every: list[Verdict] = [None] * tier.world
    dist.all_gather_object(every, verdict, group=tier.group)
    return every


def _worst(every: list[Verdict]) -> Verdict:
    """A corrupt part first (it is recorded), else an unavailable one, else None."""
    corrupt = next((v for v in every if isinstance(v, str)), None)
    return corrupt if corrupt is not None else next((v for v in every if v is not None), None)
