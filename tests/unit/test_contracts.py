"""Every import-linter contract in pyproject.toml bites: for each one, imports that break it are added, one at a
time, to the real import graph of the tree, and the contract, checked on that graph, reports itself broken.

Read from pyproject, so a contract added there is probed too; a contract of a type with no probe here fails
the test until it gets one. `make lint` checks the contracts against the tree as it is; this checks that
each could fail at all (a module name that matches nothing, a layer listed twice, a source forbidden its own
package would all pass `make lint` unnoticed).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter import api
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import Contract

ROOT = Path(__file__).resolve().parents[2]
CONFIG = api.read_configuration(str(ROOT / "pyproject.toml"))
SESSION: dict[str, Any] = CONFIG["session_options"]
CONTRACTS: list[dict[str, Any]] = CONFIG["contracts_options"]

Probe = tuple[str, str]
"""An import to add: importer, imported."""


def _forbidden(options: dict[str, Any]) -> Iterator[Probe]:
    """Each source importing each module it is forbidden."""
    yield from itertools.product(options["source_modules"], options["forbidden_modules"])


def _independence(options: dict[str, Any]) -> Iterator[Probe]:
    """Each module importing each other one."""
    yield from itertools.permutations(options["modules"], 2)


def _layers(options: dict[str, Any]) -> Iterator[Probe]:
    """Every module of a lower layer importing a higher layer, every higher module imported from a lower one,
    and each independent sibling (`a | b`) importing the next."""
    for container in options.get("containers", [""]):
        prefix = f"{container}." if container else ""
        layers = [
            [prefix + name.strip(" ()") for name in re.split(r"[|:]", layer)] for layer in options["layers"]
        ]
        for high, low in itertools.combinations(layers, 2):
            yield from ((module, high[0]) for module in low)
            yield from ((low[0], module) for module in high[1:])
        for layer, names in zip(options["layers"], layers, strict=True):
            if "|" in layer:
                yield from itertools.pairwise(names)
                yield names[-1], names[0]


PROBES: dict[str, tuple[type[Contract], Callable[[dict[str, Any]], Iterator[Probe]]]] = {
    "forbidden": (ForbiddenContract, _forbidden),
    "independence": (IndependenceContract, _independence),
    "layers": (LayersContract, _layers),
}


def _expand(name: str, graph: grimp.ImportGraph) -> list[str]:
    """The modules a contract's name stands for: itself, or each module a wildcard (`*`: one part) matches.
    A name outside the tree (an external package, not yet in the graph) stands for itself."""
    if "*" not in name:
        return (
            [name] if name in graph.modules or name.partition(".")[0] not in SESSION["root_packages"] else []
        )
    pattern = re.compile(re.escape(name).replace(r"\*", r"[^.]+") + "$")
    return sorted(m for m in graph.modules if pattern.match(m))


def _related(importer: str, imported: str) -> bool:
    """One is the other or contains it: such an import is a package's own, not a probe of the contract."""
    return importer == imported or imported.startswith(f"{importer}.") or importer.startswith(f"{imported}.")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    """The tree's import graph, built as `lint-imports` builds it (no cache: nothing written)."""
    return grimp.build_graph(
        *SESSION["root_packages"],
        include_external_packages=bool(SESSION.get("include_external_packages")),
        exclude_type_checking_imports=bool(SESSION.get("exclude_type_checking_imports")),
        cache_dir=None,
    )


def test_pyproject_has_contracts() -> None:
    assert len(CONTRACTS) >= 8


@pytest.mark.parametrize("options", CONTRACTS, ids=[str(c["name"]) for c in CONTRACTS])
def test_each_contract_is_broken_by_an_import_that_breaks_it(
    graph: grimp.ImportGraph, options: dict[str, Any]
) -> None:
    kind = options["type"]
    if kind not in PROBES:
        pytest.fail(f"no probe for contract type {kind!r}: add one to {Path(__file__).name}")
    cls, probes = PROBES[kind]
    contract = cls(name=options["name"], session_options=SESSION, contract_options=options)
    assert contract.check(graph, verbose=False).kept, "broken on the tree itself: `make lint` says where"
    named = list(probes(options))
    ours = {m for probe in named for m in probe if m.partition(".")[0] in SESSION["root_packages"]}
    gone = sorted(m for m in ours if not _expand(m, graph))
    assert not gone, f"names modules the tree does not have: {gone}"
    planned = [
        (importer, imported)
        for pattern, target in named
        for importer in _expand(pattern, graph)
        for imported in _expand(target, graph)
        if not _related(importer, imported)
    ]
    tried, missed = 0, []
    for importer, imported in planned:
        present = importer in graph.modules and imported in graph.modules
        if present and graph.direct_import_exists(importer=importer, imported=imported):
            continue  # allowed and present (an independent layer's name repeated, say): not a probe
        added = [m for m in (importer, imported) if m not in graph.modules]
        graph.add_import(importer=importer, imported=imported, line_number=1, line_contents="probe")
        try:
            tried += 1
            if contract.check(graph, verbose=False).kept:
                missed.append(f"{importer} -> {imported}")
        finally:
            graph.remove_import(importer=importer, imported=imported)
            for module in added:
                graph.remove_module(module)
    assert tried, "no probe: the contract names nothing to break"
    assert not missed, f"kept despite {len(missed)} of {tried} imports that break it: {missed}"
