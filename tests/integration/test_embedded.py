"""The real console script in fresh processes, training nothing: the log-only demo on the embedded default and
against an external server, server management, a control plane that never imports torch (the training demos:
tests/e2e/test_embedded.py)."""

import subprocess
from pathlib import Path

from ftrain.events.jetstream.nats_server import ServerProcess
from tests.support.builders import SIGNER
from tests.support.processes import ftrain_process, modules_imported_by
from tests.support.servers import login


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
