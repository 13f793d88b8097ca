"""The supervisor lease against a real nats-server: the server's per-message TTL expires it, compare-and-set
picks one of two takers, a live lease refuses a relaunch and an expired one is taken over with `failed`
(lost) naming its holder; a log out of reach decides nothing; the read-only key reads it, never takes it."""

import asyncio
import time
from pathlib import Path

import msgspec
import pytest

from ftrain.errors import Refused
from ftrain.events.jetstream.lease import LeaseTaken, open_leases
from ftrain.events.jetstream.nats_server import ServerProcess, stop_server
from ftrain.events.lease_record import Holder
from ftrain.events.log_port import LogUnavailable
from ftrain.events.schema import Failed, Launched
from ftrain.service import RunService
from ftrain.settings import nats as nats_settings
from ftrain.supervise.lease_keeper import LeaseKeeper, this_supervisor
from tests.support.processes import ftrain_process

TTL = 3


def launched(run_id: str) -> Launched:
    return Launched(
        run_id=run_id, project="p", strategy="ddp", nodes=1, gpus_per_node=1, hosts=("localhost",),
        allocation_source="local", rdzv_endpoint="127.0.0.1:1", command=("train",), storage="/tmp/x",
    )  # fmt: skip


def holder(pid: int = 1000) -> Holder:
    return msgspec.structs.replace(this_supervisor(TTL, attempt=1), pid=pid)


async def test_a_lease_lives_while_renewed_and_the_server_expires_it_one_ttl_after_the_last_renewal(
    env: dict[str, str],
) -> None:
    async with open_leases(nats_settings(env)) as leases:
        mine = holder()
        revision = await leases.take("r", mine, 0)
        for _ in range(3):  # renewed past two TTLs
            await asyncio.sleep(TTL / 2)
            revision = await leases.renew("r", mine, revision)
            assert (await leases.read("r")).live
        renewed = time.monotonic()
        expired, view = await leases.until_expired("r", await leases.read("r"))
        took = time.monotonic() - renewed
        assert expired and not view.live and view.holder == mine  # the last holder is still named
        assert TTL - 0.5 <= took <= TTL + 1, took


async def test_of_two_takers_of_an_expired_lease_one_wins_and_the_loser_renews_into_a_refusal(
    env: dict[str, str],
) -> None:
    settings = nats_settings(env)
    async with open_leases(settings) as a, open_leases(settings) as b:
        first, second = holder(1), holder(2)
        results = await asyncio.gather(
            a.take("race", first, 0), b.take("race", second, 0), return_exceptions=True
        )
        assert sorted(type(r).__name__ for r in results) == ["LeaseTaken", "int"], results
        won = next(r for r in results if isinstance(r, int))
        winner, loser = (first, second) if isinstance(results[0], int) else (second, first)
        assert (await a.read("race")).holder == winner
        with pytest.raises(LeaseTaken):  # a loser that thought it held the lease learns at its renewal
            await b.renew("race", loser, won - 1)
        await a.release("race", won)
        view = await a.read("race")
        assert not view.live and view.holder == winner


async def test_a_relaunch_is_refused_by_a_renewed_lease_and_takes_over_an_expired_one_recording_lost(
    app: RunService, env: dict[str, str]
) -> None:
    settings = nats_settings(env)
    run = (await app.launch(lambda r: launched(r), lambda: ["lost-1"])).run_id
    async with open_leases(settings) as leases:
        app.leases = leases
        old = holder(4242)
        keeper = LeaseKeeper(run, settings, old, await app.take_lease(run, old)).start()
        try:
            started = time.monotonic()
            with pytest.raises(Refused, match=r"is running \(another supervisor\?\): .* pid 4242 .* holds"):
                await app.claim(run, holder(1))
            assert time.monotonic() - started <= TTL  # refused at the first renewal seen
        finally:
            keeper.close(release=False)  # the supervisor dies: its lease is left to expire
        died, relauncher = time.monotonic(), holder(1)
        claim = await app.claim(run, relauncher)
        taken_over = time.monotonic() - died
        assert taken_over <= TTL + 2, taken_over
        assert isinstance(claim.lost, Failed) and claim.lost.reason == "lost"
        assert "pid 4242 (attempt 1)" in claim.lost.message
        state = await app.state_of(run)
        assert (state.status, state.last_failure) == ("failed", "lost")
        assert (await leases.read(run)).holder == msgspec.structs.replace(relauncher, attempt=2)
        print(f"lease TTL {TTL} s: run taken over {taken_over:.2f} s after its supervisor stopped renewing")


async def test_a_running_run_never_leased_keeps_the_refusal_that_asks_for_ftrain_fail(
    app: RunService, env: dict[str, str]
) -> None:
    run = (await app.launch(lambda r: launched(r), lambda: ["unleased"])).run_id
    async with open_leases(nats_settings(env)) as leases:
        app.leases = leases
        with pytest.raises(Refused, match=r"is running \(another supervisor\?\); .*ftrain fail unleased"):
            await app.claim(run, holder())
        assert not (await leases.read(run)).live  # nothing taken
    assert (await app.state_of(run)).status == "running"


@pytest.mark.own_server
async def test_with_the_log_out_of_reach_nothing_is_decided_from_a_stale_lease(
    env: dict[str, str], server: ServerProcess, tmp_path: Path
) -> None:
    settings = nats_settings(env)
    async with open_leases(settings) as leases:
        await leases.take("stale", holder(), 0)
    stop_server(tmp_path / "server")  # the test's server (conftest's `server`), gone
    started = time.monotonic()
    with pytest.raises(LogUnavailable):
        async with open_leases(settings, deadline=2) as leases:
            await leases.read("stale")
    assert time.monotonic() - started < 10


def test_the_read_only_key_shows_the_lease_and_may_neither_take_nor_break_it(tmp_path: Path) -> None:
    from tests.integration.test_read_only_credential import issue, reader_env

    writer = {
        "FTRAIN_HOME": str(tmp_path / "home"),
        "FTRAIN_STORAGE": str(tmp_path / "ckpt"),
        "FTRAIN_NATS_URL": "",
    }
    try:
        assert (
            ftrain_process(
                ["launch", "P", "--nodes", "1", "--gpus-per-node", "1", "--run-id", "ro"], writer
            ).returncode
            == 0
        )
        seed = issue(writer, tmp_path / "reader.nk")
        reader = reader_env(tmp_path, writer, seed)
        mine = holder(77)

        async def owner_takes() -> int:
            async with open_leases(nats_settings(writer)) as leases:
                return await leases.take("ro", mine, 0)

        revision = asyncio.run(owner_takes())
        status = ftrain_process(["status", "ro", "--json"], reader)
        assert status.returncode == 0, status.stderr
        shown = msgspec.json.decode(status.stdout)["supervisor"]
        assert shown["live"] and shown["holder"]["pid"] == 77

        async def reader_tries() -> list[str]:
            refused = []
            async with open_leases(nats_settings(reader), deadline=3) as leases:
                for attempt in (
                    lambda: leases.take("ro", holder(66), revision),  # break it (its revision is known)
                    lambda: leases.take("other", holder(66), 0),  # take a fresh one
                    lambda: leases.release("ro", revision),
                ):
                    try:
                        await attempt()
                    except Exception as exc:  # each refusal is named below
                        refused.append(type(exc).__name__)
                assert (await leases.read("ro")).holder == mine
            return refused

        assert asyncio.run(reader_tries()) == ["PermissionDenied", "PermissionDenied", "PermissionDenied"]
    finally:
        stop_server(Path(writer["FTRAIN_HOME"]))
