"""The JetStream event store passes the port's conformance cases (tests/support/log_conformance.py) against a
real nats-server; what only JetStream does (its stream settings, deduplicated retries, direct-get headers,
retries while unavailable) is tests/integration/test_store.py."""

from collections.abc import AsyncIterator

import pytest

from ftrain.events.anchor_file import AnchorFiles
from ftrain.events.jetstream.nats_client import Nats
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.events.jetstream.store import EventStore
from ftrain.events.record import STREAM
from ftrain.events.signing import Signer, TrustList
from tests.support.log_conformance import EventLogContract, LogBackend


class JetStreamBackend:
    """Stores over one connection to the test's server."""

    def __init__(self, nc: Nats) -> None:
        self.nc = nc

    def open(
        self,
        *,
        signer: Signer | None = None,
        trust: TrustList | None = None,
        anchors: AnchorFiles | None = None,
    ) -> EventStore:
        return EventStore(self.nc, signer=signer, trust=trust, anchors=anchors)

    async def delete(self) -> None:
        await self.nc.jetstream().delete_stream(STREAM)


class TestJetStreamStore(EventLogContract):
    @pytest.fixture
    async def backend(self, server: ServerProcess) -> AsyncIterator[LogBackend]:
        nc = Nats()
        await nc.connect(server.url, nkeys_seed=server.nkey_file)
        try:
            yield JetStreamBackend(nc)
        finally:
            await nc.close()
