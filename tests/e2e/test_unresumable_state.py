"""A state only one rank holds a refused value in stops the save on every rank together, under torchrun: no
rank is left waiting in the save's collectives, and nothing is written (one process:
tests/integration/test_resumable_state.py)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.processes import free_port

SCRIPT = textwrap.dedent(
    """
    import sys

    import torch.distributed as dist
    from torch import nn

    from ftrain.train.checkpointing import CheckpointManager, UnresumableState
    from ftrain.train.process_exit import run_then_exit


    class Unknown:
        pass


    class Tracker:
        def state_dict(self):
            return {"best": Unknown() if dist.get_rank() == 1 else 0.5}

        def load_state_dict(self, state):
            pass


    def main():
        dist.init_process_group("gloo")
        ckpt = CheckpointManager(LOCATION, model=nn.Linear(2, 1), states={"tracker": Tracker()})
        try:
            ckpt.load()
            ckpt.save(1)
        except UnresumableState as exc:
            sys.stdout.write(f"rank {dist.get_rank()}: {exc}\\n")  # one write: print's two interleave
            sys.stdout.flush()
        finally:
            ckpt.close()
            dist.destroy_process_group()


    run_then_exit(main)
    """
)


def test_a_value_one_rank_holds_refuses_the_save_on_every_rank_and_writes_nothing(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(f"LOCATION = {str(tmp_path / 'ckpt')!r}\n{SCRIPT}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    for name in ("FTRAIN_KILL_AT", "FTRAIN_RUN_ID", "FTRAIN_CKPT_DIR", "FTRAIN_ATTEMPT"):
        env.pop(name, None)
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(script),
    ]  # fmt: skip
    done = subprocess.run(torchrun, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    refusal = (
        "checkpoint at step 1 not saved (rank 1): state item tracker['best'] (a __main__.Unknown) names "
        "__main__.Unknown, which is not allowed"
    )
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    assert [line.partition(", so no resume")[0] for line in lines] == [
        f"rank 0: {refusal}",
        f"rank 1: {refusal}",
    ]
    assert list((tmp_path / "ckpt").glob("*step-*")) == []
