"""`scripts/gpu_check.sh` where no GPU is, up to its first step: it parses, and without a GPU says so in one
line and exits 2 (its full run, on a GPU or as a `--cpu` dry run, takes minutes: not part of the suite)."""

import os
import subprocess
from pathlib import Path

from tests.support.paths import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_gpu_check_parses_and_without_a_gpu_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    nvidia_smi = tmp_path / "nvidia-smi"  # what it prints on a machine whose driver finds no GPU
    nvidia_smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    nvidia_smi.chmod(0o755)
    done = subprocess.run(
        [str(SCRIPT)],
        env=os.environ | {"PATH": f"{tmp_path}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("gpu_check: no CUDA device visible") and done.stderr.count("\n") == 1
