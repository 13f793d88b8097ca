"""The real console script in fresh processes: the embedded default, an external server, server management."""

import re
import subprocess
from pathlib import Path

import pytest

from ftrain.events.jetstream.server import ServerProcess
from tests.builders import SIGNER
from tests.conftest import ftrain_process, login, modules_imported_by


def log_demo_checks(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    out = result.stdout
    assert "checkpoint step 1000 file state.json hash mismatch → skipped" in out
    assert "from step 500 epoch 2 " in out and "— optimizer state preserved." in out
    assert "state       completed" in out
    assert (
        f"Verified 8 event(s) in 1 run(s): every chain intact and anchored; signed by {SIGNER} (1 run(s))"
        in out
    )


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
        assert sorted(p.name for p in (tmp_path / "home" / "checkpoints" / "dist-demo-1x2-fsdp").glob("step-*")) == [
            "step-40", "step-50", "step-60"
        ]  # fmt: skip
    finally:
        ftrain_process(["server", "stop"], env)


def test_log_demo_on_the_embedded_default_then_reuse_restart_and_stop(tmp_path: Path) -> None:
    env = {"FTRAIN_HOME": str(tmp_path / "home"), "FTRAIN_NATS_URL": "", "FTRAIN_STORAGE": ""}
    try:
        log_demo_checks(ftrain_process(["demo", "--log-only"], env))
        status = ftrain_process(["server", "status"], env)
        assert status.returncode == 0 and status.stdout.startswith("nats-server running at nats://127.0.0.1:")
        assert (tmp_path / "home" / "checkpoints").is_dir()  # FTRAIN_STORAGE defaults under FTRAIN_HOME
        listing = ftrain_process(["list", "JPCP"], env)  # a later process reuses the same server
        assert listing.returncode == 0 and len(listing.stdout.splitlines()) == 2
        assert ftrain_process(["server", "stop"], env).stdout == "nats-server stopped\n"
        stopped = ftrain_process(["server", "status"], env)
        assert stopped.returncode == 3 and stopped.stdout.startswith("nats-server not running")
        # a read-only command does not start it again; `server start` does, on the same store: every event
        # survived
        refused = ftrain_process(["audit", "verify"], env)
        assert (refused.returncode, refused.stdout) == (1, "") and "`ftrain server start`" in refused.stderr
        assert ftrain_process(["server", "start"], env).returncode == 0
        audit = ftrain_process(["audit", "verify"], env)
        assert (
            audit.stdout
            == f"Verified 8 event(s) in 1 run(s): every chain intact and anchored; signed by {SIGNER} (1 run(s))\n"
        )
    finally:
        ftrain_process(["server", "stop"], env)


def test_demo_against_an_external_server(tmp_path: Path, server: ServerProcess) -> None:
    env = {
        "FTRAIN_HOME": str(tmp_path / "home"),
        **login(server),
        "FTRAIN_STORAGE": str(tmp_path / "s"),
    }
    log_demo_checks(ftrain_process(["demo", "--log-only"], env))
    assert not (tmp_path / "home" / "nats").exists()  # no embedded server was started
    refused = ftrain_process(["server", "start"], env)
    assert refused.returncode == 2
    assert (
        refused.stderr == "ftrain server: error: FTRAIN_NATS_URL is set: ftrain does not manage that server\n"
    )


def test_the_control_plane_never_imports_torch() -> None:
    wanted = {"ftrain.cli.main", "ftrain.cli.commands", "ftrain.service", "ftrain.cli.demo", "ftrain.cli.demo_log",
              "ftrain.supervise.supervisor", "ftrain.workers.recorder", "ftrain.settings", "ftrain.events.jetstream.store", "ftrain.projections.projector"}  # fmt: skip
    loaded = modules_imported_by(wanted)
    assert wanted <= loaded
    assert not {m for m in loaded if m.partition(".")[0] == "torch"}


@pytest.mark.slow
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
        assert "s3://ftrain/checkpoints/dist-demo-1x2-fsdp/step-60" in out  # status shows the S3 URI
        assert f"Verified 10 event(s) in 1 run(s): every chain intact and anchored; signed by {SIGNER}" in out
        assert (
            "sealed on S3 under s3://ftrain/checkpoints/dist-demo-1x2-fsdp/: step-60, step-50, step-40" in out
        )
        digests = re.findall(r"params_sha256=([0-9a-f]{64})", out)
        assert len(digests) == 4 and len(set(digests)) == 1
        assert "identical: the SIGKILL cost recomputed steps, nothing else" in out
        assert not (tmp_path / "home" / "checkpoints" / "dist-demo-1x2-fsdp").exists()
    finally:
        ftrain_process(["storage", "stop"], env)
        ftrain_process(["server", "stop"], env)
