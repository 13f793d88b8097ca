"""What docs/event-log.md tells a stream consumer, computed the way the page says and held to the code: canonical
JSON re-implemented with nothing but the standard `json` module, the anchor file's name, an audit note's
root, a finding's null `seq`, and the verifier's install line (the published schema, vectors and patterns on
the built site: tests/integration/test_published_contract.py)."""

import ast
import hashlib
import importlib.metadata
import json
import random
import re
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from packaging.requirements import Requirement

from ftrain.domain.chain_walk import ChainWalk, Finding
from ftrain.events.anchors import PrefixRoot
from ftrain.events.chain import GENESIS
from ftrain.events.jetstream.connection import NatsSettings, anchor_files
from ftrain.events.record import StoredRecord
from ftrain.events.schema import FAILURE_REASONS, MAX_AMOUNT, Completed, Failed, encode_event
from ftrain.events.stored_schema import stored_schema
from tests.support.docs import blocks
from tests.support.paths import ROOT, VECTORS

PAGE = ROOT / "docs" / "event-log.md"
TEXT = PAGE.read_text("utf-8")
CHAINS = {
    name: json.loads((VECTORS / name).read_text("utf-8"))
    for name in ("events.json", "events-before-attempts.json", "signed-events.json")
}
TRAILER = ("hash", "signer", "sig")

# -- canonical JSON, as the page defines it -------------------------------------------------------------------


def canonical(value: Any) -> str:
    """The page's rule: compact, members in the given order, strings as `json` writes them unescaped, floats by
    the rule below; everything but floats is exactly `json.dumps(…, ensure_ascii=False, separators=(",", ":"))`."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{canonical(k)}:{canonical(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if isinstance(value, float):
        return canonical_float(value)
    return json.dumps(value, ensure_ascii=False)


def canonical_float(x: float) -> str:
    """Fewest round-trip digits (`repr`); positional from 1e-5 up with a fraction digit, `<digits>e-<n>` below."""
    shortest = repr(x)
    if "e" not in shortest:
        return shortest
    if x >= 1e-5:
        return format(Decimal(shortest), "f")
    digits, exponent = shortest.split("e")
    return f"{digits}e{int(exponent)}"


def ordered(doc: dict[str, Any], definition: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """`doc`'s members in the order of `definition`'s `properties` in the published schema, nested objects too."""
    out: dict[str, Any] = {}
    for name, prop in definition["properties"].items():
        if name not in doc:
            continue
        value = doc[name]
        refs = [r["$ref"] for r in prop.get("anyOf", [prop]) if "$ref" in r]
        if isinstance(value, dict) and refs:
            value = ordered(value, defs[refs[0].removeprefix("#/$defs/")], defs)
        out[name] = value
    assert out.keys() == doc.keys(), set(doc) - set(out)
    return out


def rebuilt_body(payload: str) -> bytes:
    """A stored payload decoded, its members shuffled and its trailer dropped, then written again by the rule."""
    schema = stored_schema()
    doc = {k: v for k, v in json.loads(payload).items() if k not in TRAILER}
    shuffled = dict(random.Random(len(payload)).sample(list(doc.items()), len(doc)))
    definition = next(
        d for d in schema["$defs"].values() if d["properties"].get("type", {}).get("enum") == [doc["type"]]
    )
    return canonical(ordered(shuffled, definition, schema["$defs"])).encode()


def test_canonical_json_by_the_pages_rule_reproduces_every_vectors_hash() -> None:
    for name, chain in CHAINS.items():
        entries = chain["events"] if isinstance(chain, dict) else chain
        for entry in entries:
            body = rebuilt_body(entry["payload"])
            assert hashlib.sha256(entry["prev_hash"].encode() + body).hexdigest() == entry["hash"], name


@given(
    message=st.text(st.characters(exclude_categories=("Cs",))),
    cost=st.floats(min_value=0, max_value=MAX_AMOUNT),
    seconds=st.sampled_from([0.0, 1e-7, 1.5e-6, 9.99e-6, 1e-5, 2.5e-5, 1e-4, 0.1, 64.0, 1e12]),
)
def test_the_pages_rule_writes_what_ftrain_writes_for_any_text_and_float(
    message: str, cost: float, seconds: float
) -> None:
    """Escapes and the float forms where Python's `json` differs (below 1e-4) included."""
    for event in (
        Failed(run_id="r", seq=1, id="0" * 32, prev_hash=GENESIS, reason="oom", message=message, exit_code=-1),
        Completed(run_id="r", seq=2, id="1" * 32, prev_hash=GENESIS, cost_gpu_hours=cost,
                  running_seconds=seconds, cost_source="reported"),
    ):  # fmt: skip
        written = encode_event(event)
        assert rebuilt_body(written.decode()) == written


def test_the_pages_float_examples_follow_its_rule_and_pythons_json_differs_below_1e_minus_4() -> None:
    for x, shown in (
        (64.0, "64.0"),
        (14400.0, "14400.0"),
        (0.5, "0.5"),
        (0.00001234, "0.00001234"),
        (1.5e-6, "1.5e-6"),
    ):
        assert canonical_float(x) == shown and f"`{shown}`" in TEXT
    assert (json.dumps(0.000025), json.dumps(1.5e-6)) == ("2.5e-05", "1.5e-06")
    assert all(json.dumps(x) == canonical_float(x) for x in (0.0, 1e-4, 0.1, 64.0, 14400.0, 1e12))


# -- anchors ---------------------------------------------------------------------------------------------------


def test_the_anchor_file_of_a_log_set_by_url_is_named_by_12_hex_of_the_urls_sha256(tmp_path: Path) -> None:
    url = re.search(r"`FTRAIN_NATS_URL=(\S+)` writes `anchors-([0-9a-f]{12})\.log`", TEXT)
    assert url is not None, "the page's example of an anchor file name"
    assert hashlib.sha256(url[1].encode()).hexdigest()[:12] == url[2]
    for value in (url[1], " nats://a:4222, nats://b:4222", "nats://ü:4222"):
        expected = f"anchors-{hashlib.sha256(value.encode()).hexdigest()[:12]}.log"
        assert anchor_files(NatsSettings(home=tmp_path, url=value)) == [tmp_path / expected]
    assert anchor_files(NatsSettings(home=tmp_path)) == [tmp_path / "anchors.log"]


def test_the_audit_notes_root_is_computed_from_the_event_vectors_as_the_page_says() -> None:
    """Records 1 to `stream_seq`, each `<seq> <run> <type> <length>\\n` then the payload, nothing between."""
    note = json.loads(json.loads((VECTORS / "anchors.json").read_text("utf-8"))["lines"][-1]["line"])
    records = [
        StoredRecord(seq, *e["subject"].removeprefix("ftrain.run.").rsplit(".", 1), e["payload"].encode())
        for seq, e in enumerate(CHAINS["events.json"], start=1)
    ]
    assert note["stream_seq"] == len(records)
    data = b"".join(
        f"{r.stream_seq} {r.run_id} {r.event_type} {len(r.payload)}\n".encode() + r.payload for r in records
    )
    code = PrefixRoot()
    for r in records:
        code.add(r.stream_seq, r.run_id, r.event_type, r.payload)
    assert note["root"] == "sha256:" + hashlib.sha256(data).hexdigest() == code.value()


# -- the views' findings --------------------------------------------------------------------------------------


def test_a_finding_has_a_null_seq_for_an_undecodable_payload_and_after_a_chain_break() -> None:
    first = CHAINS["events.json"][0]
    bounds = first["payload"].replace('"nodes":2', '"nodes":100001')
    walk = ChainWalk()
    found = walk.feed(StoredRecord(1, "vector-run", "launched", bounds.encode()))
    assert isinstance(found, Finding) and (found.seq, found.event_type) == (None, "launched")
    assert found.reason.startswith("undecodable payload")
    later = walk.feed(
        StoredRecord(2, "vector-run", "checkpointed", CHAINS["events.json"][1]["payload"].encode())
    )
    assert isinstance(later, Finding) and (later.seq, later.reason) == (None, "after a chain break")
    assert "**A finding's `seq` is null**" in TEXT and "after a chain break" in TEXT


# -- the verifier's install line ------------------------------------------------------------------------------


def test_the_install_line_provides_every_module_the_verifier_imports() -> None:
    (line,) = [b.body.strip() for b in blocks(PAGE) if b.lang == "text" and b.body.startswith("pip install ")]
    wanted = [Requirement(r.strip('"')) for r in line.removeprefix("pip install ").split()]
    named = {r.name.lower() for r in wanted}
    extras = {
        Requirement(dependency).name.lower()
        for r in wanted
        for extra in r.extras
        for dependency in importlib.metadata.requires(r.name) or []
        if f"extra == '{extra}'" in dependency
    }
    assert "nkeys" in extras, "nats-py signs in with an nkey seed only with its nkeys extra"
    verifier = next(b for b in blocks(PAGE) if b.lang == "python" and "nkeys_seed" in b.body)
    tree = ast.walk(ast.parse(verifier.body))
    imported = {a.name for n in tree if isinstance(n, ast.Import) for a in n.names} | {
        n.module or "" for n in ast.walk(ast.parse(verifier.body)) if isinstance(n, ast.ImportFrom)
    }
    providers = importlib.metadata.packages_distributions()
    third_party = {m.split(".")[0] for m in imported} - sys.stdlib_module_names
    assert third_party == {"nats", "nacl"}
    for module in third_party:
        assert {d.lower() for d in providers[module]} & named, f"{module} is not installed by: {line}"


def test_the_page_names_every_failure_reason_ftrain_records() -> None:
    """The `failed` row lists each reason a writer of ftrain's records (`setup`, `hang` and `lost` were
    missing: a consumer could not tell a set-up failure from a made-up reason)."""
    page = (ROOT / "docs" / "event-log.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `failed` |"))
    assert set(re.findall(r"`([a-z-]+)`", row.split("`reason`", 1)[1])) >= set(FAILURE_REASONS)
