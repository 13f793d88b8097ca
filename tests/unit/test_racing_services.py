"""Services racing on one run's head (as two CLI commands or supervisors at once), over the in-process log:
exactly one resume, one failure, one run id each; the chain never forks. The same races between CLI
processes on a real server: tests/integration/test_failures.py."""

import asyncio
from pathlib import Path

from ftrain.errors import Refused
from ftrain.events.chain import GENESIS
from ftrain.events.schema import AnyEvent, CorruptSkipped, Failed, Resumed
from ftrain.service import RunService
from ftrain.service.run_commands import ResumeOutcome
from tests.support.in_process import OpenService
from tests.support.runs import checkpoint, launch, launch_maker, stored


async def failed_run_with_corrupt_newest_checkpoint(app: RunService, storage: Path, run: str) -> None:
    await launch(app, run)
    await checkpoint(app, run, 10)
    await checkpoint(app, run, 20)
    (storage / run / "step-20" / "state.json").write_bytes(b'{"a":2}')  # same size, other bytes
    await app.fail(run, reason="node-failure", exit_code=137)


def assert_one_skip_then_one_resume(
    records: list[tuple[int, AnyEvent, str]], storage: Path, run: str
) -> None:
    events = [e for _, e, _ in records]
    assert [type(e).__name__ for e in events] == [
        "Launched",
        "Checkpointed",
        "Checkpointed",
        "Failed",
        "CorruptSkipped",
        "Resumed",
    ]
    skip, resumed = events[4], events[5]
    assert isinstance(skip, CorruptSkipped) and isinstance(resumed, Resumed)
    assert (skip.checkpoint_seq, skip.step, skip.reason) == (3, 20, "file state.json hash mismatch")
    assert (resumed.checkpoint_seq, resumed.step, resumed.resume_count, resumed.forced) == (2, 10, 1, False)
    assert sorted(p.name for p in (storage / run).iterdir()) == ["step-10", "step-20.corrupt-5"]


async def test_two_services_racing_resume_never_fork_the_chain(
    app: RunService, env: dict[str, str], another: OpenService
) -> None:
    storage = Path(env["FTRAIN_STORAGE"])
    runs = [f"race-{n}" for n in range(3)]
    for run in runs:
        await failed_run_with_corrupt_newest_checkpoint(app, storage, run)
    async with another() as one, another() as two:
        for run in runs:
            outcomes = await asyncio.gather(one.resume(run), two.resume(run), return_exceptions=True)
            won = [o for o in outcomes if isinstance(o, ResumeOutcome)]
            lost = [o for o in outcomes if not isinstance(o, ResumeOutcome)]
            assert len(won) == 1 and len(lost) == 1, outcomes
            assert won[0].resumed is not None and won[0].resumed.checkpoint_seq == 2
            assert isinstance(lost[0], Refused)
            assert str(lost[0]) == f"run {run} is running; resume follows a failure (or use --force)"
            assert_one_skip_then_one_resume(await stored(app, run), storage, run)
    report = await app.verify()
    assert (report.ok, report.events, report.runs) == (True, 6 * len(runs), len(runs))


async def test_three_services_racing_launch_take_three_run_ids(
    app: RunService, env: dict[str, str], another: OpenService
) -> None:
    base = "dist-P-1x1-fsdp"

    def candidates() -> list[str]:
        return [base] + [f"{base}-{n}" for n in range(2, 100)]

    async with another() as one, another() as two, another() as three:
        events = await asyncio.gather(*(s.launch(launch_maker(), candidates) for s in (one, two, three)))
    assert sorted(e.run_id for e in events) == [base, f"{base}-2", f"{base}-3"]
    records = await stored(app)
    assert sorted((e.run_id, e.seq, e.prev_hash) for _, e, _ in records) == [
        (base, 1, GENESIS),
        (f"{base}-2", 1, GENESIS),
        (f"{base}-3", 1, GENESIS),
    ]
    assert (await app.verify()).ok


async def test_two_services_racing_fail_exactly_one_lands(
    app: RunService, env: dict[str, str], another: OpenService
) -> None:
    run = "race-fail"
    await launch(app, run)
    async with another() as one, another() as two:
        outcomes = await asyncio.gather(
            one.fail(run, reason="oom", exit_code=137),
            two.fail(run, reason="node-failure", exit_code=1),
            return_exceptions=True,
        )
    landed = [o for o in outcomes if isinstance(o, Failed)]
    refused = [o for o in outcomes if isinstance(o, Refused)]
    assert len(landed) == 1 and len(refused) == 1, outcomes
    assert str(refused[0]) == f"run {run} is failed; it cannot be failed (resume it first)"
    events = [e for _, e, _ in await stored(app, run)]
    assert [type(e).__name__ for e in events] == ["Launched", "Failed"]
    assert events[1].id == landed[0].id
    state = await app.state_of(run)
    assert (state.status, state.failures, state.last_failure) == ("failed", 1, landed[0].reason)
    assert (await app.verify(run)).ok
