"""What the docs site publishes for stream consumers, built for real: the JSON Schema is the command's, the test
vectors are the repository's, every pattern the event-log page shows is a working regular expression, and the
page's statements about anchors and the views hold on a real log (computed from the vectors:
tests/unit/test_consumer_contract.py)."""

import hashlib
import html
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from ftrain.events.stored_schema import stored_schema
from tests.support.cli import RUN, Cli, launch
from tests.support.docs import BIN, blocks
from tests.support.paths import ROOT, VECTORS
from tests.support.processes import ftrain_process

PAGE = ROOT / "docs" / "event-log.md"
PATTERN_ITEM = re.compile(r"<li>((?:<code>[a-z_]+</code>(?:, )?)+): <code>(\^[^<]*\$)</code>")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs site, built strict as `make docs` builds it."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [BIN / "mkdocs", "build", "--strict", "--quiet", "--site-dir", out],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return out


def test_the_site_serves_the_schema_the_command_prints(site: Path) -> None:
    printed = ftrain_process(["events", "schema"], {})
    assert printed.returncode == 0, printed.stderr
    assert (site / "schema" / "event.schema.json").read_text("utf-8") == printed.stdout
    assert 'href="../schema/event.schema.json"' in (site / "event-log" / "index.html").read_text("utf-8")


def test_the_site_serves_every_test_vector_byte_for_byte(site: Path) -> None:
    vectors = sorted(p.relative_to(VECTORS) for p in VECTORS.rglob("*") if p.is_file())
    assert Path("checkpoint/.complete") in vectors
    served = sorted(p.relative_to(site / "vectors") for p in (site / "vectors").rglob("*") if p.is_file())
    assert served == vectors
    page = (site / "event-log" / "index.html").read_text("utf-8")
    for name in vectors:
        assert (site / "vectors" / name).read_bytes() == (VECTORS / name).read_bytes(), name
        assert f'href="../vectors/{name.as_posix()}"' in page, f"the page links {name}"


def vector_values(member: str) -> list[str]:
    """Every value of `member` in the stored event vectors (payloads parsed, trailers included)."""
    chains = [json.loads((VECTORS / n).read_text("utf-8")) for n in ("events.json", "signed-events.json")]
    payloads = [json.loads(e["payload"]) for c in chains for e in (c["events"] if isinstance(c, dict) else c)]
    return [p[member] for p in payloads if member in p]


def test_every_pattern_the_page_renders_matches_the_vectors_values_and_the_schemas(site: Path) -> None:
    """A `\\|` in a Markdown table was rendered with its backslash: the `id` pattern then matched no id."""
    page = (site / "event-log" / "index.html").read_text("utf-8")
    shown = [
        (html.unescape(m[2]), re.findall(r"<code>([a-z_]+)</code>", m[1]))
        for m in PATTERN_ITEM.finditer(page)
    ]
    assert len(shown) == 5, shown
    properties = stored_schema()["$defs"]["Checkpointed"]["properties"]
    checked = set()
    for pattern, members in shown:
        regex = re.compile(pattern)
        for member in members:
            values = vector_values(member)
            if member in properties and "pattern" in properties[member]:
                assert properties[member]["pattern"] == pattern, member
            assert values and all(regex.fullmatch(v) for v in values), (member, pattern)
            checked.add(member)
            assert not regex.fullmatch(values[0] + "|"), (member, pattern)
        assert not regex.fullmatch(""), pattern
    assert {"run_id", "id", "prev_hash", "hash", "signer", "sig", "checkpoint_hash"} <= checked


def test_no_code_on_the_site_shows_an_escaped_pipe(site: Path) -> None:
    for page in site.rglob("*.html"):
        spans = re.findall(r"<code>([^<]*)</code>", page.read_text("utf-8"))
        assert not [s for s in spans if "\\|" in s], page.relative_to(site)


def documented_config() -> dict[str, str]:
    (block,) = [b for b in blocks(PAGE) if b.lang == "json" and '"subjects"' in b.body]
    config: dict[str, str] = json.loads(block.body)
    return config


def test_the_anchor_file_and_its_config_are_as_the_page_says(cli: Cli, env: dict[str, str]) -> None:
    launch(cli)
    name = f"anchors-{hashlib.sha256(env['FTRAIN_NATS_URL'].encode()).hexdigest()[:12]}.log"
    first = json.loads((Path(env["FTRAIN_HOME"]) / name).read_text("utf-8").splitlines()[0])
    assert first["config"] == documented_config()
    assert list(first["config"]) == list(documented_config())


def test_a_forged_event_is_counted_in_status_and_named_by_broken_and_nodes_lists_hosts(
    cli: Cli, env: dict[str, str], tmp_path: Path
) -> None:
    launch(cli)
    owner = cli.ok("keys", "show")[0]
    stranger = {**env, "FTRAIN_HOME": str(tmp_path / "stranger"), "FTRAIN_TRUSTED_KEYS": f"owner={owner}"}
    forged = ftrain_process(["fail", RUN, "--reason", "oom"], stranger)
    assert forged.returncode == 0, forged.stderr
    code, out, _ = cli("status", RUN, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["state"] == "broken" and doc["vouched"] is False
    assert (doc["failures"], doc["last_failure"]) == (1, "oom")  # the forgery, folded
    assert (doc["broken"]["seq"], doc["broken"]["event_type"]) == (2, "failed")
    assert doc["broken"]["reason"].startswith("signed by untrusted key ")
    assert doc["nodes"] == doc["launch"]["hosts"] == ["node07", "node08"] and doc["launch"]["nodes"] == 2
    assert "**A forged event is counted.**" in PAGE.read_text("utf-8")
