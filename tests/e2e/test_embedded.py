"""The training demos through the real console script in fresh processes: `ftrain demo` on the embedded
default and `ftrain demo --s3` on the embedded SeaweedFS each train, are killed, resume and end bit-identical
(the log-only demo and server management: tests/integration/test_embedded.py)."""

import re
from pathlib import Path

from tests.support.builders import SIGNER
from tests.support.processes import ftrain_process


def test_demo_trains_is_killed_resumes_and_ends_bit_identical_on_the_embedded_default(tmp_path: Path) -> None:
    env = {"FTRAIN_HOME": str(tmp_path / "home"), "FTRAIN_NATS_URL": "", "FTRAIN_STORAGE": ""}
    try:
        result = ftrain_process(["demo"], env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        out = result.stdout
        assert "Attempt 1 of 3 failed (killed by SIGKILL)" in out
        assert "RESUMED from step=30 (epoch=0)" in out
        assert "Attempt 2 of 3 succeeded" in out
        assert "state       completed" in out and "resumes     1" in out
        assert (
            f"Verified 10 event(s) in 1 run(s): every chain intact and anchored; signed by {SIGNER} (1 run(s))"
            in out
        )
        digests = re.findall(r"params_sha256=([0-9a-f]{64})", out)
        assert len(digests) == 4 and len(set(digests)) == 1
        assert "identical: the SIGKILL cost recomputed steps, nothing else" in out
        assert sorted(p.name for p in (tmp_path / "home" / "checkpoints" / "dist-demo-1x2").glob("step-*")) == [
            "step-40", "step-50", "step-60"
        ]  # fmt: skip
    finally:
        ftrain_process(["server", "stop"], env)


def test_demo_on_the_embedded_seaweedfs_resumes_from_s3_and_ends_bit_identical(tmp_path: Path) -> None:
    """Costly: two 2-process training jobs (one killed and relaunched) and a SeaweedFS: about 26 s here."""
    env = {"FTRAIN_HOME": str(tmp_path / "home"), "FTRAIN_NATS_URL": "", "FTRAIN_STORAGE": ""}
    try:
        result = ftrain_process(["demo", "--s3"], env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        out = result.stdout
        assert "# checkpoints go to s3://ftrain/checkpoints on SeaweedFS at http://127.0.0.1:" in out
        assert "Attempt 1 of 3 failed (killed by SIGKILL)" in out
        assert "RESUMED from step=30 (epoch=0)" in out
        assert "Attempt 2 of 3 succeeded" in out
        assert "state       completed" in out and "resumes     1" in out
        assert "s3://ftrain/checkpoints/dist-demo-1x2/step-60" in out  # status shows the S3 URI
        assert f"Verified 10 event(s) in 1 run(s): every chain intact and anchored; signed by {SIGNER}" in out
        assert "sealed on S3 under s3://ftrain/checkpoints/dist-demo-1x2/: step-60, step-50, step-40" in out
        digests = re.findall(r"params_sha256=([0-9a-f]{64})", out)
        assert len(digests) == 4 and len(set(digests)) == 1
        assert "identical: the SIGKILL cost recomputed steps, nothing else" in out
        assert not (tmp_path / "home" / "checkpoints" / "dist-demo-1x2").exists()
    finally:
        ftrain_process(["storage", "stop"], env)
        ftrain_process(["server", "stop"], env)
