"""`ftrain export RUN --to DIR`: a checkpoint's model weights as safetensors (or `torch.save` files), verified
as a resume verifies them, with their digests beside them (`ftrain.export`, docs/export.md).

The target directory is judged before the log is asked anything; the run's state is read from its own log,
vouched for by a trusted signature; torch is imported only once the export runs.
"""

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ftrain.cli.arguments import Subparsers, command, count, json_flag, run_id
from ftrain.console.output import emit, emit_json

FORMATS = ("safetensors", "torch")


def export_command(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run `ftrain export`. `--json`: `{"run_id", "step", "checkpoint_hash", "format", "dir", "files":
    [{"name", "size", "sha256"}], "digest"}`."""
    import asyncio

    from ftrain.errors import UsageError
    from ftrain.export.target import check_target

    if args.with_optimizer and args.format == "safetensors":
        raise UsageError(
            "--with-optimizer needs --format torch: safetensors holds tensors only, and the optimizer's "
            "state holds other values (its param groups: learning rate, betas)"
        )
    target = check_target(args.to)
    state = asyncio.run(_vouched_state(args.run_id, env))
    from ftrain.export.export import export

    done = export(
        state,
        args.step,
        target,
        format=args.format,
        with_optimizer=args.with_optimizer,
        max_shard=args.max_shard_size,
    )
    if args.json:
        emit_json(done)
        return 0
    size = sum(f.size for f in done.files)
    emit(
        [
            f"Exported {done.run_id} step {done.step} (checkpoint {done.checkpoint_hash[:4]}…, verified) → "
            f"{done.dir}: {len(done.files)} file(s), {size / 1e6:.1f} MB, {done.format}",
            *(f"{f.sha256}  {f.name}" for f in done.files),
            f"digest {done.digest} (of SHA256SUMS; `sha256sum -c SHA256SUMS` in {done.dir} checks every file)",
        ]
    )
    return 0


async def _vouched_state(run_id: str, env: Mapping[str, str]) -> Any:
    """The run's state from its own log, when a trusted writer vouches for it (as a resume reads it)."""
    from ftrain.cli.log_server import log_ready
    from ftrain.service import RunService

    log_ready("export", env)
    async with RunService.open(env) as app:
        return await app.vouched_state(run_id)


def _size(text: str) -> int:
    from ftrain.export.safetensors_format import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_parser(sub: Subparsers) -> None:
    """The `export` subcommand."""
    p = command(sub, "export", "write a checkpoint's model weights out as safetensors or a torch.save file", [
        "ftrain export RUN --to ./weights", "ftrain export RUN --step 5000 --to ./w --max-shard-size 2GB",
        "ftrain export RUN --to ./w --format torch --with-optimizer",
    ], "The checkpoint is verified as a resume verifies it (nothing is parsed before its digest matched the "
       "signed log); DIR must be new or an empty directory of yours. Beside the weights: export.json (where "
       "they came from) and SHA256SUMS.")  # fmt: skip
    p.add_argument("run_id", type=run_id, help="the run")
    p.add_argument("--step", type=count, help="the checkpoint's step (default: the newest valid one)")
    p.add_argument("--to", type=Path, required=True, metavar="DIR", help="a new or empty directory")
    p.add_argument("--format", choices=FORMATS, default="safetensors", help="default safetensors")
    p.add_argument(
        "--with-optimizer",
        action="store_true",
        help="also optimizer.pt, the optimizer's state (--format torch)",
    )
    p.add_argument(
        "--max-shard-size", type=_size, default="5GB", metavar="SIZE",
        help="safetensors: the most tensor bytes per file, as Hugging Face counts them (default 5GB)",
    )  # fmt: skip
    json_flag(p, "the files written and their digests")
    p.set_defaults(entry=lambda args: export_command(args, os.environ))
