"""The reference trainer against a real nats-server: its lifecycle lands in the log, and a log outage never
stalls training — the events wait in the outbox and arrive afterwards, in order, the chain intact."""

import asyncio
import subprocess
import time
from pathlib import Path

import msgspec
import pytest

from ftrain import settings
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.schema import Checkpointed, CorruptSkipped, Launched, Resumed
from ftrain.service import RunService
from ftrain.workers.outbox import Outbox, outbox_path
from tests.e2e.test_training import flip
from tests.support.servers import kill_server, restart_server
from tests.support.training import FINAL, RESUMED, launch_logged, torchrun, torchrun_command, torchrun_env

pytestmark = pytest.mark.timeout(300)
RUN = "logged-1"


async def run_events(app: RunService) -> list[object]:
    """The run's events, as the timeline folds them."""
    return [entry.event for entry in await app.timeline(RUN)]


@pytest.mark.own_server
async def test_kill_corrupt_skip_resume_and_a_broker_outage_all_reach_the_log(
    tmp_path: Path, env: dict[str, str], server: ServerProcess
) -> None:
    ckpt, job_env = launch_logged(RUN, env)
    flags = ("--train-iters", "200", "--save-interval", "20")

    first = await asyncio.to_thread(torchrun, ckpt, *flags, kill_at="step:50", env=job_env)
    assert first.returncode != 0 and "FINAL" not in first.stdout
    flip(ckpt / "step-40" / "__0_0.distcp")

    out = await asyncio.to_thread(run_through_an_outage, ckpt, flags, job_env, server)
    assert "checkpoint step 40 file __0_0.distcp hash mismatch → skipped" in out
    match = RESUMED.search(out)
    assert match and match.group(1) == "20"
    assert FINAL.search(out), "training finished with the log down"
    outbox = Outbox(outbox_path(settings.home(env)))
    try:
        assert outbox.pending(RUN) == [], "the trainer ended before the log had its events"
    finally:
        outbox.close()
    async with RunService.open(env) as app:
        events = await run_events(app)
        report = await app.verify(RUN)
        state = await app.state_of(RUN)
        goodput = await app.goodput(RUN)
    assert report.ok and report.events == len(events)
    assert isinstance(events[0], Launched)
    assert [(type(e).__name__, getattr(e, "step", None)) for e in events[1:]] == [
        ("Checkpointed", 20), ("Checkpointed", 40), ("CorruptSkipped", 40), ("Resumed", 20),
        *[("Checkpointed", s) for s in range(40, 201, 20)],
    ]  # fmt: skip
    skipped, resumed = events[3], events[4]
    assert isinstance(skipped, CorruptSkipped) and skipped.reason == "file __0_0.distcp hash mismatch"
    assert isinstance(resumed, Resumed) and resumed.forced and resumed.resume_count == 1
    last = events[-1]
    assert isinstance(last, Checkpointed) and last.uri == (ckpt / "step-200").as_uri()
    assert (state.step, state.status) == (200, "running")
    saves = [e for e in events if isinstance(e, Checkpointed)]
    assert all(msgspec.UNSET not in (e.stall_seconds, e.train_seconds, e.loop_seconds) for e in saves)
    assert [e.lost_steps for e in saves] == [msgspec.UNSET] * 2 + [30] * 9  # reached 50, resumed from 20
    assert (goodput.attempts, goodput.lost_steps, goodput.unknown) == (2, 30, [])
    assert goodput.productive is not None and 0 < goodput.productive < goodput.wall


def run_through_an_outage(
    ckpt: Path, flags: tuple[str, ...], env: dict[str, str], server: ServerProcess
) -> str:
    """Run a job, stop the broker once it has saved step 60, well before it ends, and start it again once the
    job has sealed its last step: the job waits at its end for the log to take what it recorded meanwhile.
    Returns its stdout."""
    job = subprocess.Popen(
        torchrun_command(ckpt, *flags), env=torchrun_env(env), stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (ckpt / "step-60").is_dir():
            assert time.monotonic() < deadline and job.poll() is None, "the job never saved step 60"
            time.sleep(0.02)
        kill_server(server)
        assert not (ckpt / "step-100").exists(), "the outage starts mid-training"
        while not (ckpt / "step-200").is_dir():
            assert time.monotonic() < deadline + 60 and job.poll() is None, "the job never sealed step 200"
            time.sleep(0.02)
        restart_server(server)
        out, _ = job.communicate(timeout=180)
    finally:
        job.kill()
    assert job.returncode == 0
    return out
