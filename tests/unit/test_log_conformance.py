"""The in-process event log passes the port's conformance cases (tests/support/log_conformance.py), and its
compare-and-set holds for writers in threads of their own too."""

import asyncio
import threading

import pytest

from ftrain.events.anchor_file import AnchorFiles
from ftrain.events.chain import ChainHead
from ftrain.events.log_port import AppendConflict, Appended
from ftrain.events.memory_log import InProcessLog, MemoryStream
from ftrain.events.signing import Signer, TrustList
from tests.support.builders import checkpointed, launched
from tests.support.log_conformance import EventLogContract, LogBackend


class InProcessBackend:
    """Logs over one `MemoryStream`; deleting it starts a stream not yet created."""

    def __init__(self) -> None:
        self.stream = MemoryStream()

    def open(
        self,
        *,
        signer: Signer | None = None,
        trust: TrustList | None = None,
        anchors: AnchorFiles | None = None,
    ) -> InProcessLog:
        return InProcessLog(self.stream, signer=signer, trust=trust, anchors=anchors)

    async def delete(self) -> None:
        self.stream = MemoryStream()


class TestInProcessLog(EventLogContract):
    @pytest.fixture
    def backend(self) -> LogBackend:
        return InProcessBackend()


async def test_writers_in_threads_racing_on_a_head_one_lands_the_others_conflict() -> None:
    backend = InProcessBackend()
    first = backend.open()
    await first.ensure_stream()
    head = (await first.append(launched("r1"), ChainHead())).head
    start = threading.Barrier(6)
    results: list[Appended | BaseException] = []

    def race(step: int) -> None:
        start.wait()
        try:
            results.append(asyncio.run(backend.open().append(checkpointed("r1", step), head)))
        except AppendConflict as exc:
            results.append(exc)

    threads = [threading.Thread(target=race, args=(10 * (i + 1),)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(isinstance(r, Appended) for r in results) == 1
    assert sum(isinstance(r, AppendConflict) for r in results) == 5
    assert await first.last_seq() == 2
