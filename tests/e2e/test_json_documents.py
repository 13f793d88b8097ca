"""Every `--json` document the event-log page lists is run for real, and its top-level members are exactly the
page's: a member added, renamed or dropped in the code without the page fails here."""

import json
from pathlib import Path
from typing import Any

from tests.support.cli import RUN, Cli
from tests.support.json_docs import documented
from tests.support.processes import ftrain_process

ELSEWHERE = {
    "ftrain storage status --json, running": "tests/integration/test_storage_server.py (a SeaweedFS of its own)"
}
"""Documents checked by another test, which starts what they need anyway."""


def one(lines: list[str]) -> dict[str, Any]:
    """The first document of a command's output (a list's first row)."""
    doc = json.loads(lines[0])
    return doc[0] if isinstance(doc, list) else doc


def json_of(cli: Cli, *args: str) -> dict[str, Any]:
    """`ftrain ARGS --json`, in this process: its first document (the lines for people go to stderr)."""
    code, out, err = cli(*args, "--json")
    assert code == 0, f"ftrain {' '.join(args)} --json → {code}: {err}"
    return one(out.splitlines())


def test_every_documented_json_document_has_exactly_the_documented_members(cli: Cli, tmp_path: Path) -> None:
    state = json.dumps({"optimizer": "adam", "step": 5})
    ckpt = ("--epoch", "0", "--shards", "8", "--state", state)
    seen = {"ftrain launch --json": json_of(cli, "launch", "JPCP", "--nodes", "2", "--gpus-per-node", "4")}
    seen["ftrain checkpoint --json"] = json_of(cli, "checkpoint", RUN, "--step", "5", *ckpt)
    seen["ftrain fail --json"] = json_of(cli, "fail", RUN, "--reason", "oom")
    seen["ftrain resume --json"] = json_of(cli, "resume", RUN)
    assert cli("checkpoint", RUN, "--step", "10", *ckpt)[0] == 0
    seen["ftrain complete --json"] = json_of(cli, "complete", RUN)
    seen["ftrain status RUN --json"] = json_of(cli, "status", RUN)
    seen["ftrain list [PROJECT] --json"] = json_of(cli, "list")
    seen["ftrain list [PROJECT] --json --with-launch"] = json_of(cli, "list", "--with-launch")
    seen["ftrain cost [PROJECT] --json"] = json_of(cli, "cost")
    seen["ftrain cost --run RUN --json"] = json_of(cli, "cost", "--run", RUN)
    seen["ftrain audit verify [RUN] --json"] = json_of(cli, "audit", "verify")
    seen["ftrain replay [RUN] --json"] = json_of(cli, "replay", RUN)
    seen["ftrain events tail [RUN] --json"] = json_of(cli, "events", "tail", RUN)
    seen["ftrain keys show --json"] = json_of(cli, "keys", "show")

    supervised = ftrain_process(["run", "JDOC", "--nodes", "1", "--nproc-per-node", "1", "--json", "--",
                                 "python", "-c", "pass"], cli.env)  # fmt: skip
    assert supervised.returncode == 0, supervised.stderr
    seen["ftrain run --json, when supervision ends"] = one(supervised.stdout.splitlines()[-1:])

    alone = {"FTRAIN_HOME": str(tmp_path / "alone"), "FTRAIN_NATS_URL": "", "FTRAIN_STORAGE": ""}
    for what in ("server", "storage"):
        stopped = ftrain_process([what, "status", "--json"], alone)
        assert stopped.returncode == 3, stopped.stderr
        seen[f"ftrain {what} status --json, not running"] = one(stopped.stdout.splitlines())
    assert ftrain_process(["server", "start"], alone).returncode == 0
    try:
        running = ftrain_process(["server", "status", "--json"], alone)
        seen["ftrain server status --json, running"] = one(running.stdout.splitlines())
    finally:
        assert ftrain_process(["server", "stop"], alone).returncode == 0

    page = documented()
    assert sorted(page) == sorted(
        [*seen, *ELSEWHERE]
    )  # the page lists no command left unchecked, and all here
    page["ftrain list [PROJECT] --json --with-launch"] |= page["ftrain list [PROJECT] --json"]
    wrong = {
        label: (sorted(set(doc) - page[label]), sorted(page[label] - set(doc))) for label, doc in seen.items()
    }
    assert {label: diff for label, diff in wrong.items() if diff != ([], [])} == {}, "(undocumented, missing)"
