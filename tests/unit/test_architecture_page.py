"""docs/architecture.md against the tree, so the page cannot drift from it: every file, folder and module it
names exists, and its contracts table has a row for each import-linter contract in pyproject.toml, naming
every module the contract names."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
LINES = PAGE.read_text().splitlines()
LINTER: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS: list[dict[str, Any]] = LINTER["contracts"]
TOP = {p.name for p in ROOT.iterdir()} - {".git"}
"""A path the page names starts with one of these (`events/schema.py`, `ftrain/cli/`, `scripts/…`)."""


def _code(line: str) -> list[str]:
    return re.findall(r"`([^`]+)`", line)


def _is_path(token: str) -> bool:
    return "/" in token and re.fullmatch(r"[\w./-]+", token) is not None and token.split("/")[0] in TOP


def _module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def _names(line: str) -> list[tuple[str, bool]]:
    """What a line names, each with whether it exists: paths from the top (`workers/storage/port.py`), files
    beside one of them named before on the line (`open.py`), modules (`ftrain.events.schema`, then `.chain`
    beside it). A file name with no path before it (a user's `events.py`) is not ours to check."""
    found: list[tuple[str, bool]] = []
    folders: list[Path] = []
    module = ""
    for token in _code(line):
        token = token.rstrip("…")
        if _is_path(token):
            found.append((token, (ROOT / token).exists()))
            folders.append((ROOT / token).parent if token.endswith(".py") else ROOT / token)
        elif re.fullmatch(r"\w+\.py", token) and folders:
            found.append((token, any((folder / token).is_file() for folder in folders)))
        elif re.fullmatch(r"ftrain(\.\w+)+", token):
            module = token
            found.append((token, _module_file(token) is not None))
        elif re.fullmatch(r"(\.\w+)+", token) and module:
            module = module.rpartition(".")[0] + token
            found.append((module, _module_file(module) is not None))
    return found


def test_every_file_folder_and_module_the_page_names_exists() -> None:
    missing = [
        f"line {number}: {name}"
        for number, line in enumerate(LINES, 1)
        for name, exists in _names(line)
        if not exists
    ]
    assert not missing, f"{PAGE.name} names what the tree does not have: {missing}"


def _modules(contract: dict[str, Any]) -> list[str]:
    """Every module a contract names, as the contract writes it (a layer's without its container)."""
    if contract["type"] == "layers":
        return [name.strip(" ()") for layer in contract["layers"] for name in re.split(r"[|:]", layer)]
    keys = ("source_modules", "forbidden_modules", "modules")
    return [m for key in keys for m in contract.get(key, [])]


@pytest.mark.parametrize("contract", CONTRACTS, ids=[str(c["name"]) for c in CONTRACTS])
def test_the_contracts_table_has_a_row_for_each_contract_naming_its_modules(contract: dict[str, Any]) -> None:
    rows = [line for line in LINES if line.startswith(f"| {contract['name']} |")]
    named = _modules(contract)
    assert rows, f"no row `| {contract['name']} | …` in {PAGE.name}'s contracts table: it names {named}"
    cells = set(_code(rows[0]))
    absent = [m for m in named if m not in cells]
    assert not absent, f"the row of {contract['name']!r} does not name {absent}"


def test_the_table_has_no_row_for_a_contract_that_is_gone() -> None:
    start = LINES.index("## The layering contracts") + 1
    end = next(i for i in range(start, len(LINES)) if LINES[i].startswith("## "))
    rows = [line.split(" | ")[0].removeprefix("| ") for line in LINES[start:end] if line.startswith("| ")][1:]
    gone = sorted(set(rows) - {c["name"] for c in CONTRACTS})
    assert not gone, f"rows for contracts pyproject does not have: {gone}"
