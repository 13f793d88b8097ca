"""An export, end to end: the checkpoint chosen from the run's vouched state, verified, written out, and
its digests written beside it.

Beside the weights go `export.json` (where they came from: the run, the step and the manifest digest the
log's signed `checkpointed` event carries, so the files trace back to the signed history) and `SHA256SUMS`
(`sha256sum -c` checks the directory). The export's digest is the SHA-256 of `SHA256SUMS`: one value that
covers every file, printed and logged (`exported`), never appended to the run's log (an export changes
nothing in the run, and a completed run takes no more events).
"""

from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Final, Literal

import msgspec
import structlog

from ftrain.domain.lifecycle import CheckpointRef, RunState
from ftrain.errors import NotFound, Refused
from ftrain.export.safetensors_out import write_safetensors
from ftrain.export.source import verified_checkpoint
from ftrain.export.target import staged
from ftrain.export.torch_out import write_torch
from ftrain.export.written import Written, write_new
from ftrain.workers.integrity import Digest, digest_of, to_hex

Format = Literal["safetensors", "torch"]
PROVENANCE: Final = "export.json"
SUMS: Final = "SHA256SUMS"
log = structlog.get_logger(__name__)


class Provenance(msgspec.Struct, frozen=True):
    """`export.json`: what was exported, from which checkpoint (its `checkpoint_hash` is the one in the
    log's `checkpointed` event), and the digest of each file written with it."""

    run_id: str
    step: int
    epoch: int
    checkpoint_hash: str
    source: str
    format: Format
    files: dict[str, Digest]
    exported_at: str
    ftrain_version: str


class Exported(msgspec.Struct, frozen=True):
    """What `ftrain export --json` prints: the provenance's facts, the directory, every file (the sidecars
    included) and the export's digest (that of `SHA256SUMS`)."""

    run_id: str
    step: int
    checkpoint_hash: str
    format: Format
    dir: str
    files: list[Written]
    digest: Digest


def pick(state: RunState, step: int | None) -> CheckpointRef:
    """The checkpoint to export: the newest the log holds valid (at `step`, when given). NotFound when the
    log recorded none; Refused when the step's checkpoint was found corrupt or deleted by retention."""
    valid = [ref for ref in state.checkpoints if ref.status == "valid"]
    if step is None:
        if not valid:
            raise NotFound(f"run {state.run_id} has no valid checkpoint to export")
        return max(valid, key=lambda ref: (ref.step, ref.seq))
    if chosen := [ref for ref in valid if ref.step == step]:
        return max(chosen, key=lambda ref: ref.seq)
    if gone := [ref for ref in state.checkpoints if ref.step == step]:
        ref = max(gone, key=lambda ref: ref.seq)
        why = f"was found corrupt ({ref.reason})" if ref.status == "corrupt" else "was deleted by retention"
        raise Refused(f"run {state.run_id}'s checkpoint at step {step} {why}")
    steps = ", ".join(str(s) for s in sorted({ref.step for ref in valid})) or "none"
    raise NotFound(f"run {state.run_id} recorded no checkpoint at step {step} (valid steps: {steps})")


def export(
    state: RunState,
    step: int | None,
    target: Path,
    *,
    format: Format,
    with_optimizer: bool = False,
    max_shard: int,
) -> Exported:
    """Write the chosen checkpoint's weights to `target` (checked by `target.check_target`), verified first;
    nothing is left under `target` unless every file was written."""
    ref = pick(state, step)
    with verified_checkpoint(state, ref) as source, staged(target) as out:
        if format == "safetensors":
            files = write_safetensors(source, out, max_shard)
        else:
            files = write_torch(source, out, with_optimizer)
        provenance = Provenance(
            run_id=state.run_id,
            step=ref.step,
            epoch=ref.epoch,
            checkpoint_hash=ref.checkpoint_hash,
            source=ref.uri,
            format=format,
            files={f.name: f.sha256 for f in files},
            exported_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            ftrain_version=version("ftrain"),
        )
        encoded = msgspec.json.format(msgspec.json.encode(provenance), indent=2) + b"\n"
        files.append(write_new(out / PROVENANCE, lambda f: f.write(encoded)))
        sums = "".join(
            f"{to_hex(f.sha256)}  {f.name}\n" for f in sorted(files, key=lambda f: f.name)
        ).encode()
        files.append(write_new(out / SUMS, lambda f: f.write(sums)))
    exported = Exported(
        state.run_id, ref.step, ref.checkpoint_hash, format, str(target), files, digest_of(sums)
    )
    log.info("exported", run_id=state.run_id, step=ref.step, checkpoint_hash=ref.checkpoint_hash,
             dir=str(target), digest=exported.digest)  # fmt: skip
    return exported
