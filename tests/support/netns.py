"""The multi-node harness (`scripts/cluster.py`) for tests: a cluster of network namespaces, skipped with one
clear reason where they cannot be made (not root), unless FTRAIN_REQUIRE_NETNS=1 (set by CI) makes that a
failure."""

import asyncio
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.support.paths import ROOT

FTRAIN = str(Path(sys.executable).with_name("ftrain"))

_spec = importlib.util.spec_from_file_location("cluster", ROOT / "scripts" / "cluster.py")
assert _spec is not None and _spec.loader is not None
cluster = importlib.util.module_from_spec(_spec)
sys.modules["cluster"] = cluster
_spec.loader.exec_module(cluster)


def require_netns() -> None:
    """Skip (or, with FTRAIN_REQUIRE_NETNS=1, fail) unless network namespaces can be made here."""
    why = cluster.unavailable()
    if why is None:
        return
    if os.environ.get("FTRAIN_REQUIRE_NETNS") == "1":
        pytest.fail(f"multi-node tests required (FTRAIN_REQUIRE_NETNS=1) but {why}")
    pytest.skip(f"multi-node tests: {why}")


def stream_leader(nodes: Any) -> str:
    """The node whose NATS server leads the event stream now (asked from the host)."""

    async def ask() -> str:
        client = await nats.connect(
            servers=nodes.nats_urls().split(","), nkeys_seed=str(nodes.nats_seed()), connect_timeout=5
        )
        try:
            info = await client.jetstream().stream_info("FTRAIN_EVENTS")
            assert info.config.num_replicas == 3 and info.cluster is not None
            return str(info.cluster.leader)
        finally:
            await client.close()

    return asyncio.run(ask())


@pytest.fixture(scope="session")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Three nodes, shared by the multi-node tests: a NATS server on each (one JetStream cluster), each node's
    writer key made and trusted by the others, as users would exchange them."""
    require_netns()
    found = cluster.Cluster(tmp_path_factory.mktemp("cluster"), 3).up()
    try:
        for node in found.nodes:
            found.start_nats(node)
        keys = {}
        for node in found.nodes:
            made = found.run(node, [FTRAIN, "keys", "init"])
            assert made.returncode == 0, made.stderr
            keys[node] = made.stdout.split()[0]
        for node in found.nodes:  # every node trusts every other node's writer key
            for other, key in keys.items():
                if other != node:
                    assert found.run(node, [FTRAIN, "keys", "trust", other, key]).returncode == 0
        yield found
    finally:
        found.down()
