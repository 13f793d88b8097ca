"""Every CLI command and its output lines, in-process against a real nats-server, SQLite and files."""

import json
import os
import re
import shutil
from pathlib import Path

import msgspec
import pytest

from ftrain.events.schema import Failed
from tests.integration.test_goodput_cli import store
from tests.support.builders import SIGNER, launched, written_checkpoint
from tests.support.cli import RUN, TIME, Cli, checkpoint, ckpt_args, launch

HUGE = "9" * 23


def test_the_seed_scenario_line_by_line(cli: Cli) -> None:
    assert launch(cli, "--dataset-revision", "A1-rev", "--checkpoint-every", "10min") == [
        f"Launched {RUN} — 2×4 GPUs, fsdp, rdzv node07:29500",
        f"  torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=node07:29500 --rdzv_id={RUN}"
        " -m ftrain.examples.train",
    ]
    root = cli.storage().as_uri()
    [line] = checkpoint(cli, 500, 2)
    assert re.fullmatch(
        rf"Checkpoint step 500 epoch 2 → {root}/{RUN}/step-500 \(hash [0-9a-f]{{4}}…, 8 shard\(s\)\)", line
    )
    checkpoint(cli, 1000, 5)
    assert cli.ok("fail", RUN, "--reason", "preempted") == [f"Marked {RUN} failed (preempted) — failure 1"]
    (cli.storage() / RUN / "step-1000" / "state.json").write_text('{"tampered": true}')
    assert cli.ok("resume", RUN) == [
        "checkpoint step 1000 file state.json is 18 bytes, manifest says 44 → skipped",
        f"Resuming {RUN} from step 500 epoch 2 ({root}/{RUN}/step-500) — optimizer state preserved.",
        f"  torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=node07:29500 --rdzv_id={RUN}"
        " -m ftrain.examples.train",
    ]
    assert sorted(p.name for p in (cli.storage() / RUN).iterdir()) == ["step-1000.corrupt-5", "step-500"]
    checkpoint(cli, 1000, 5)  # the name is free again: the corrupt one was set aside
    status = cli.ok("status", RUN)
    assert status[:3] == [
        f"run         {RUN} (project JPCP)",
        "state       running",
        "step        1000 (epoch 5)",
    ]
    assert status[5:7] == ["resumes     1", "failures    1 (last: preempted)"]
    assert status[-1].startswith("chain head  seq 7 ")
    assert cli.ok("complete", RUN, "--cost-gpu-hours", "12.5") == [
        f"Completed {RUN} — 12.50 GPU-hours (reported)"
    ]
    listed = cli.ok("list", "JPCP")
    assert (
        listed[0]
        == "RUN            PROJECT  STATE      STEP  RESUMES  FAILURES  COST             UPDATED               SIGNED BY"
    )
    assert re.fullmatch(
        rf"{RUN}  JPCP     completed  1000  1        1         12\.50 GPU-hours  {TIME}  {SIGNER}", listed[1]
    ), listed
    assert cli.ok("cost")[-1] == "total 12.50 GPU-hours over 1 run(s)"
    assert cli.ok("audit", "verify") == [
        f"Verified 8 event(s) in 1 run(s): every chain intact and anchored; signed by {SIGNER} (1 run(s))"
    ]
    timeline = cli.ok("replay", RUN)
    assert all(re.match(rf"#\d+ +{TIME}  {RUN}  seq ", line) for line in timeline), timeline
    kinds = [line.split()[5] for line in timeline]
    assert kinds == ["launched", "checkpointed", "checkpointed", "failed", "corrupt_skipped", "resumed",
                     "checkpointed", "completed"]  # fmt: skip


def test_json_outputs_for_consumers(cli: Cli) -> None:
    launch(cli)
    checkpoint(cli, 10, 0)
    status = json.loads(cli.ok("status", RUN, "--json")[0])
    assert (status["state"], status["step"], status["last_valid_checkpoint"]["step"]) == ("running", 10, 10)
    assert status["chain_head"]["seq"] == 2 and status["launch"]["hosts"] == ["node07", "node08"]
    assert [r["run_id"] for r in json.loads(cli.ok("list", "--json")[0])] == [RUN]
    cost = json.loads(cli.ok("cost", "JPCP", "--json")[0])
    assert cost["runs"][0]["gpus"] == 8 and cost["runs"][0]["source"] == "so far"
    audit = json.loads(cli.ok("audit", "verify", RUN, "--json")[0])
    assert audit == {
        "ok": True,
        "events": 2,
        "runs": 1,
        "findings": [],
        "signers": {RUN: SIGNER},
        "stream_findings": [],
        "accepted": [],
        "ignored": [],
    }
    replay = json.loads(cli.ok("replay", "--json")[0])
    assert [e["event"]["type"] for e in replay] == ["launched", "checkpointed"]
    assert replay[1]["hash"] and replay[1]["event"]["prev_hash"] == replay[0]["hash"]
    schema = json.loads("\n".join(cli.ok("events", "schema")))
    assert {"Launched", "Checkpointed", "Failed", "Resumed", "CorruptSkipped", "Completed"} <= set(
        schema["$defs"]
    )


def test_default_run_ids_allocations_and_strategies(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[003-004,010]")
    monkeypatch.setenv("MLFLOW_RUN_ID", "mlf-123")
    first = cli.ok("launch", "P", "--nodes", "2", "--gpus-per-node", "8")  # the script's strategy: unknown
    assert first[0] == "Launched dist-P-2x8 — 2×8 GPUs, fsdp, rdzv gpu003:29500"
    again = cli.ok("launch", "P", "--nodes", "2", "--gpus-per-node", "8", "--rdzv-port", "29600")
    assert again[0] == "Launched dist-P-2x8-2 — 2×8 GPUs, fsdp, rdzv gpu003:29600"
    named = cli.ok("launch", "P", "--nodes", "2", "--gpus-per-node", "8", "--strategy", "ddp")
    assert named[0] == "Launched dist-P-2x8-ddp — 2×8 GPUs, ddp, rdzv gpu003:29500"
    monkeypatch.setenv("SLURM_JOB_ID", "731")  # inside the job: its own port, unless one is given
    in_job = cli.ok("launch", "P", "--nodes", "2", "--gpus-per-node", "8")
    assert in_job[0] == "Launched P-slurm-731 — 2×8 GPUs, fsdp, rdzv gpu003:20731"
    given = cli.ok(
        "launch", "P", "--nodes", "2", "--gpus-per-node", "8", "--run-id", "r2", "--rdzv-port", "29600"
    )
    assert given[0] == "Launched r2 — 2×8 GPUs, fsdp, rdzv gpu003:29600"
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("cn5\ncn5\ncn6\ncn6\n")
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    zero = cli.ok(
        "launch",
        "P",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--strategy",
        "zero",
        "--",
        "train.py",
        "--lr",
        "1",
    )
    assert zero[1].endswith(
        "--rdzv_id=dist-P-2x4-zero train.py --lr 1 --deepspeed --deepspeed_config ds_config.json"
    )
    assert "rdzv cn5:29500" in zero[0]
    mega = cli.ok(
        "launch",
        "P",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--strategy",
        "megatron",
        "--tp",
        "4",
        "--pp",
        "2",
    )
    assert mega[1].endswith(
        "-m ftrain.examples.train --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2"
    )
    status = json.loads(cli.ok("status", "dist-P-2x8", "--json")[0])
    assert status["launch"]["strategy"] == "fsdp"  # what its command was built for
    assert status["launch"]["mlflow_run_id"] == "mlf-123"
    assert status["launch"]["allocation_source"] == "slurm"
    assert status["launch"]["hosts"] == ["gpu003", "gpu004"]
    code, _, err = cli("launch", "Q", "--nodes", "1", "--gpus-per-node", "1", "--run-id", "dist-P-2x8")
    assert (code, err) == (1, "ftrain launch: run dist-P-2x8 already exists\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("status", "a.b"), "ftrain status: error: argument run_id: run id 'a.b' is invalid"),
        (("fail", "*"), "ftrain fail: error: argument run_id: run id '*' is invalid"),
        (("resume", ">"), "ftrain resume: error: argument run_id: run id '>' is invalid"),
        (("complete", ""), "ftrain complete: error: argument run_id: run id is empty"),
        (("status", "r" * 200), "ftrain status: error: argument run_id: run id is 200 characters long (at most 128)"),
        (("checkpoint", RUN, "--step", "5", "--epoch", "0", "--shards", "1", "--state", "{not json"),
         "ftrain checkpoint: error: the training state is not valid JSON"),
        (("checkpoint", RUN, "--step", "-5", "--epoch", "0", "--shards", "1", "--state", "{}"),
         "ftrain checkpoint: error: argument --step: -5 is not between 0 and 9223372036854775807"),
        (("checkpoint", RUN, "--step", "5", "--epoch", "0", "--shards", "0", "--state", "{}"),
         "ftrain checkpoint: error: argument --shards: 0 is not between 1 and 102400000"),
        (("checkpoint", RUN, "--step", "5", "--epoch", "0", "--shards", "1", "--state-file", "/nonexistent/x.json"),
         "ftrain checkpoint: error: --state-file /nonexistent/x.json: No such file or directory"),
        (("launch", "a.b", "--nodes", "1", "--gpus-per-node", "1"), "ftrain launch: error: argument project: project 'a.b'"),
        (("launch", "P", "--nodes", "3", "--gpus-per-node", "1", "--nodelist", "n[1-2]"),
         "ftrain launch: error: allocation has 2 host(s) (n[1-2]) but --nodes 3 was asked (source: nodelist)"),
        (("launch", "P", "--nodes", "1", "--gpus-per-node", "1", "--nodelist", "n[2-1]"),
         "ftrain launch: error: reversed range '2-1' in 'n[2-1]'"),
        (("launch", "P", "--nodes", "1", "--gpus-per-node", "1", "--checkpoint-every", "often"),
         "ftrain launch: error: --checkpoint-every 'often': use a duration like 10min, 90s, 2h or a count like 500steps"),
        (("launch", "P", "--nodes", "1", "--gpus-per-node", "2", "--strategy", "megatron", "--tp", "4"),
         "ftrain launch: error: megatron: tensor_parallel*pipeline_parallel (4*1=4) must divide nodes*gpus_per_node (1*2=2)"),
        (("launch", "P" * 130, "--nodes", "1", "--gpus-per-node", "1"), "ftrain launch: error: argument project"),
        (("launch", "P", "--nodes", "0", "--gpus-per-node", "1"), "ftrain launch: error: argument --nodes"),
        (("frobnicate",), "ftrain: error: argument command: invalid choice"),
        (("status", RUN, "--", "x"), "ftrain status: error: unexpected arguments after --"),
        (("complete", RUN, "--cost-gpu-hours", "-1"), "ftrain complete: error: argument --cost-gpu-hours"),
        # every number that reaches the log is bounded by the schema (one huge one once bricked the log)
        (ckpt_args(HUGE, "0", "1", "--state", "{}"),
         f"ftrain checkpoint: error: argument --step: {HUGE} is not between 0 and 9223372036854775807"),
        (ckpt_args("5", HUGE, "1", "--state", "{}"),
         f"ftrain checkpoint: error: argument --epoch: {HUGE} is not between 0 and 9223372036854775807"),
        (ckpt_args("5", "0", HUGE, "--state", "{}"),
         f"ftrain checkpoint: error: argument --shards: {HUGE} is not between 1 and 102400000"),
        (("launch", "P", "--nodes", HUGE, "--gpus-per-node", "1"),
         f"ftrain launch: error: argument --nodes: {HUGE} is not between 1 and 100000"),
        (("launch", "P", "--nodes", "1", "--gpus-per-node", "4096"),
         "ftrain launch: error: argument --gpus-per-node: 4096 is not between 1 and 1024"),
        (("fail", RUN, "--exit-code", str(2**63)), "ftrain fail: error: argument --exit-code: 9223372036854775808 is not between"),
        (("complete", RUN, "--cost-gpu-hours", "nan"), "ftrain complete: error: argument --cost-gpu-hours: 'nan' is not a number between 0 and 1e+12"),
        (("complete", RUN, "--cost-gpu-hours", "1e999"), "ftrain complete: error: argument --cost-gpu-hours: '1e999' is not a number between"),
        (("complete", RUN, "--cost-gpu-hours", "1e13"), "ftrain complete: error: argument --cost-gpu-hours: '1e13' is not a number between"),
        # the training state is strict JSON, of bounded size and depth: never stored as something else
        (ckpt_args("5", "0", "1", "--state", '{"lr": NaN}'),
         "ftrain checkpoint: error: the training state is not valid JSON (JSON is malformed"),
        (ckpt_args("5", "0", "1", "--state", '{"lr": 1e999}'),
         "ftrain checkpoint: error: the training state is not valid JSON (Number out of range"),
        (ckpt_args("5", "0", "1", "--state", '"\\ud800"'),
         "ftrain checkpoint: error: the training state is not valid JSON"),
        (ckpt_args("5", "0", "1", "--state", '"\udcff"'),
         "ftrain checkpoint: error: --state is not valid UTF-8"),
        (ckpt_args("5", "0", "1", "--state", "[" * 100_000 + "]" * 100_000),
         "ftrain checkpoint: error: the training state is nested too deeply"),
        (ckpt_args("5", "0", "1", "--state-file", "/dev/zero"),
         "ftrain checkpoint: error: --state-file /dev/zero: larger than 1048576 bytes"),
        (ckpt_args("5", "0", "1", "--state", " " * (1024 * 1024 + 1)),
         "ftrain checkpoint: error: the training state is larger than 1048576 bytes"),
        # text that is not Unicode (an undecodable argv byte) and a command too large for one event
        (("fail", RUN, "--message", "bad \udcff byte"), "ftrain fail: error: failed event holds text that is not valid Unicode"),
        (("launch", "P", "--nodes", "1", "--gpus-per-node", "1", "--", "train", "x" * 1_200_000),
         "ftrain launch: error: launched event of 12"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    cli: Cli, args: tuple[str, ...], message: str
) -> None:
    launch(cli)
    before = cli.last_seq()
    files_before = sorted(cli.storage().rglob("*")) if cli.storage().exists() else []
    code, out, err = cli(*args)
    assert code == 2
    assert out == ""
    assert err.startswith(message), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert cli.last_seq() == before
    assert (sorted(cli.storage().rglob("*")) if cli.storage().exists() else []) == files_before


@pytest.mark.parametrize(
    "args",
    [
        ("checkpoint", "nope", "--step", "5", "--epoch", "0", "--shards", "1", "--state", "{}"),
        ("resume", "nope"),
        ("status", "nope"),
        ("fail", "nope"),
        ("complete", "nope"),
        ("cost", "--run", "nope"),
        ("replay", "nope"),
        ("audit", "verify", "nope"),
        ("events", "tail", "nope"),
    ],
)
def test_an_unknown_run_is_not_found_exit_1_as_git_and_kubectl_and_writes_nothing(
    cli: Cli, args: tuple[str, ...]
) -> None:
    launch(cli)
    before = cli.last_seq()
    assert cli(*args) == (1, "", f"ftrain {args[0]}: unknown run 'nope'\n")
    assert cli.last_seq() == before
    assert not (cli.storage() / "nope").exists()


@pytest.mark.parametrize("storage", ["file://nfs-server/ckpt", "file://otherhost:22/ckpt"])
def test_a_file_uri_naming_another_host_is_refused_not_read_as_local(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, storage: str
) -> None:
    monkeypatch.setenv("FTRAIN_STORAGE", storage)
    code, out, err = cli("launch", "P", "--nodes", "1", "--gpus-per-node", "1")
    assert (code, out) == (2, "")
    assert (
        err == f"ftrain launch: error: storage {storage!r}: file:// on host {storage[7:].split('/')[0]!r} "
        "is not supported (use file:///path)\n"
    )
    assert cli.last_seq() == 0
    monkeypatch.setenv("FTRAIN_STORAGE", f"file://localhost{cli.storage()}")
    assert cli.ok("launch", "P", "--nodes", "1", "--gpus-per-node", "1")


def test_refusals_on_the_merits_exit_1_and_append_nothing(cli: Cli) -> None:
    launch(cli)
    checkpoint(cli, 100, 1)
    refusals = [
        (("checkpoint", RUN, "--step", "50", "--epoch", "0", "--shards", "8", "--state", "{}"),
         f"ftrain checkpoint: run {RUN} is at step 100; checkpoint step 50 does not advance it"),
        (("resume", RUN), f"ftrain resume: run {RUN} is running; resume follows a failure (or use --force)"),
        (("complete", RUN), None),
        (("fail", RUN), f"ftrain fail: run {RUN} is completed; nothing may follow completion"),
        (("checkpoint", RUN, "--step", "500", "--epoch", "0", "--shards", "8", "--state", "{}"),
         f"ftrain checkpoint: run {RUN} is completed; nothing may follow completion"),
        (("resume", RUN, "--force"), f"ftrain resume: run {RUN} is completed; nothing may follow completion"),
    ]  # fmt: skip
    for args, message in refusals:
        before = cli.last_seq()
        code, out, err = cli(*args)
        if message is None:
            assert code == 0
            continue
        assert (code, out, err) == (1, "", message + "\n")
        assert cli.last_seq() == before
    assert sorted(p.name for p in (cli.storage() / RUN).iterdir()) == ["step-100"]


def corrupt_flip(d: Path) -> None:
    data = bytearray((d / "state.json").read_bytes())
    data[3] ^= 0x20
    (d / "state.json").write_bytes(bytes(data))


def corrupt_truncate(d: Path) -> None:
    (d / "state.json").write_bytes((d / "state.json").read_bytes()[:-5])


def corrupt_manifest_and_marker(d: Path) -> None:
    """Rewrite the manifest so it agrees with tampered data and re-stamp the marker: only the log catches it."""
    from ftrain.workers.integrity import digest_of
    from ftrain.workers.layout import MARKER
    from ftrain.workers.manifest import Marker

    manifest = json.loads((d / "manifest.json").read_text())
    manifest["epoch"] = 99
    raw = json.dumps(manifest).encode()
    (d / "manifest.json").write_bytes(raw)
    (d / MARKER).write_bytes(msgspec.json.encode(Marker(digest_of(raw), manifest["step"])))


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        (corrupt_flip, "file state.json hash mismatch"),
        (corrupt_truncate, "file state.json is 39 bytes, manifest says 44"),
        (lambda d: (d / ".complete").unlink(), "completion marker missing"),
        (lambda d: (d / "manifest.json").unlink(), "manifest missing"),
        (lambda d: (d / "state.json").unlink(), "file state.json missing"),
        (corrupt_manifest_and_marker, "hash mismatch"),
        (lambda d: (d / ".complete").write_text(f'{{"manifest_sha256": "{"0" * 64}", "step": 1}}'),
         "completion marker does not match the manifest"),
    ],
)  # fmt: skip
def test_corrupt_newest_is_skipped_and_resume_falls_back(cli: Cli, corrupt, reason: str) -> None:  # type: ignore[no-untyped-def]
    launch(cli)
    checkpoint(cli, 500, 2)
    checkpoint(cli, 1000, 5)
    cli.ok("fail", RUN)
    corrupt(cli.storage() / RUN / "step-1000")
    lines = cli.ok("resume", RUN)
    assert lines[0] == f"checkpoint step 1000 {reason} → skipped"
    assert lines[1].startswith(f"Resuming {RUN} from step 500 epoch 2 ")


def test_all_checkpoints_corrupt_exits_1_without_resuming(cli: Cli) -> None:
    launch(cli)
    checkpoint(cli, 500, 2)
    checkpoint(cli, 1000, 5)
    cli.ok("fail", RUN)
    for step in (500, 1000):
        corrupt_flip(cli.storage() / RUN / f"step-{step}")
    code, out, err = cli("resume", RUN)
    assert code == 1
    assert out.splitlines() == [
        "checkpoint step 1000 file state.json hash mismatch → skipped",
        "checkpoint step 500 file state.json hash mismatch → skipped",
    ]
    assert err == f"ftrain resume: run {RUN}: no valid checkpoint (2 recorded, all invalid); not restarting\n"
    kinds = [line.split()[5] for line in cli.ok("replay", RUN)]
    assert kinds.count("resumed") == 0 and kinds.count("corrupt_skipped") == 2
    code, out, err = cli("resume", RUN)  # known-corrupt checkpoints are not re-examined or re-recorded
    assert (code, out) == (1, "")
    assert cli.ok("status", RUN)[1] == "state       failed"


def test_resume_without_any_checkpoint_exits_1(cli: Cli) -> None:
    launch(cli)
    cli.ok("fail", RUN, "--reason", "node-failure")
    before = cli.last_seq()
    code, _, err = cli("resume", RUN)
    assert (code, err) == (1, f"ftrain resume: run {RUN} has no checkpoint to resume from\n")
    assert cli.last_seq() == before


def test_checkpoint_from_a_directory_and_a_state_file(cli: Cli, tmp_path: Path) -> None:
    launch(cli)
    shards = tmp_path / "dcp"
    (shards / "sub").mkdir(parents=True)
    for rank in range(2):
        (shards / f"__{rank}_0.distcp").write_bytes(bytes([rank]) * 1000)
    (shards / ".metadata").write_bytes(b"meta")
    (shards / "sub" / "extra.bin").write_bytes(b"x")
    code, _, err = cli(
        "checkpoint", RUN, "--step", "1", "--epoch", "0", "--shards", "3", "--path", str(shards)
    )
    assert (code, err) == (
        2,
        f"ftrain checkpoint: error: --path {shards} holds 2 .distcp shard(s) but --shards 3 was given\n",
    )
    cli.ok("checkpoint", RUN, "--step", "1", "--epoch", "0", "--shards", "2", "--path", str(shards))
    manifest = json.loads((cli.storage() / RUN / "step-1" / "manifest.json").read_text())
    assert [(f["name"], f["size"]) for f in manifest["files"]] == [
        (".metadata", 4), ("__0_0.distcp", 1000), ("__1_0.distcp", 1000), ("sub/extra.bin", 1)]  # fmt: skip
    state_file = tmp_path / "state.json"
    state_file.write_text('{"b": 1, "a": [1, 2]}')
    cli.ok("checkpoint", RUN, "--step", "2", "--epoch", "0", "--shards", "1", "--state-file", str(state_file))
    assert (cli.storage() / RUN / "step-2" / "state.json").read_text() == '{"a":[1,2],"b":1}'


def test_a_file_name_that_is_not_utf8_is_bad_input_and_leaves_no_directory(cli: Cli, tmp_path: Path) -> None:
    launch(cli)
    shards = tmp_path / "dcp"
    shards.mkdir()
    (shards / os.fsdecode(b"rank\xff.distcp")).write_bytes(b"x")
    before = cli.last_seq()
    code, out, err = cli(
        "checkpoint", RUN, "--step", "5", "--epoch", "0", "--shards", "1", "--path", str(shards)
    )
    assert (code, out) == (2, "")
    assert (
        err
        == f"ftrain checkpoint: error: --path {shards}: file name 'rank\\udcff.distcp' is not valid UTF-8\n"
    )
    assert cli.last_seq() == before
    assert not (cli.storage() / RUN).exists()


def test_an_orphan_directory_is_refused_not_overwritten(cli: Cli) -> None:
    launch(cli)
    orphan = cli.storage() / RUN / "step-7"
    orphan.mkdir(parents=True)
    (orphan / "junk").write_text("left by a crash")
    before = cli.last_seq()
    code, _, err = cli("checkpoint", RUN, "--step", "7", "--epoch", "0", "--shards", "1", "--state", "{}")
    assert code == 1 and "already exists but the log has no such checkpoint" in err
    assert (orphan / "junk").read_text() == "left by a crash"
    assert cli.last_seq() == before


def test_replay_rebuild(cli: Cli) -> None:
    launch(cli)
    checkpoint(cli, 1, 0)
    assert cli.ok("replay", "--rebuild") == ["Rebuilt the read model from stream seq 1: 2 event(s) applied"]
    assert cli.ok("status", RUN)[2] == "step        1 (epoch 0)"


def test_a_checkpoint_retention_retired_shows_pruned_and_a_resume_never_tries_it(cli: Cli) -> None:
    """A trainer's `checkpointed` at step 300 names step 100 retired, and retention deleted its directory:
    `status --json` shows it `pruned` (not `valid`), and a resume that refuses the newer two stops there,
    never recording `corrupt_skipped … directory missing` for a step retention deleted."""
    storage = cli.storage()
    written = [written_checkpoint(storage, RUN, step) for step in (100, 200, 300)]
    written[2] = msgspec.structs.replace(written[2], retired=(100,))
    started = msgspec.structs.replace(launched(RUN), storage=storage.as_uri())
    store(cli.env, [started, *written, Failed(run_id=RUN, reason="preempted")])
    shutil.rmtree(storage / RUN / "step-100")

    status = json.loads(cli.ok("status", RUN, "--json")[0])
    assert [(c["step"], c["status"]) for c in status["checkpoints"]] == [
        (100, "pruned"),
        (200, "valid"),
        (300, "valid"),
    ]
    assert status["last_valid_checkpoint"]["step"] == 300
    for step in (200, 300):
        corrupt_flip(storage / RUN / f"step-{step}")
    code, out, err = cli("resume", RUN)
    assert (code, out.splitlines()) == (
        1,
        [
            "checkpoint step 300 file state.json hash mismatch → skipped",
            "checkpoint step 200 file state.json hash mismatch → skipped",
        ],
    )
    assert err == (
        f"ftrain resume: run {RUN}: no valid checkpoint (2 recorded, all invalid, 1 more pruned by retention); "
        "not restarting\n"
    )
    kinds = [line.split()[5] for line in cli.ok("replay", RUN)]
    assert kinds.count("corrupt_skipped") == 2
    status = json.loads(cli.ok("status", RUN, "--json")[0])
    assert [c["status"] for c in status["checkpoints"]] == ["pruned", "corrupt", "corrupt"]
