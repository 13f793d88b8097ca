"""The CLI follows its ecosystem's conventions (issue 26): --version, shell completion, --json on every
command that prints a result, a closed pipe, RFC 3339 times, cadences recorded, read-only commands that never
start a server, CPU jobs, a quiet library, and a start-up that loads only what the command needs. Real
processes, a real nats-server, a real bash (what the parser alone shows: tests/unit/test_cli_parser.py)."""

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ftrain.events.jetstream.nats_server import server_status, stop_server
from tests.support.cli import RUN, TIME, Cli, checkpoint, launch
from tests.support.processes import ftrain_process

FTRAIN = str(Path(sys.executable).with_name("ftrain"))


def test_version_is_the_installed_packages() -> None:
    done = subprocess.run([FTRAIN, "--version"], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"ftrain {importlib.metadata.version('ftrain')}\n",
        "",
    )


def test_bash_completion_sourced_in_a_real_bash_completes_commands_and_options() -> None:
    script = subprocess.run([FTRAIN, "completion", "bash"], capture_output=True, text=True, check=True).stdout
    probe = f"""{script}
complete -p ftrain
fn=$(complete -p ftrain | sed -E 's/.* -F ([^ ]+) .*/\\1/')
COMP_WORDS=(ftrain st); COMP_CWORD=1; COMP_LINE="ftrain st"; COMP_POINT=${{#COMP_LINE}}
$fn ftrain st ftrain; echo "subcommands: ${{COMPREPLY[*]}}"
COMP_WORDS=(ftrain status --j); COMP_CWORD=2; COMP_LINE="ftrain status --j"; COMP_POINT=${{#COMP_LINE}}
$fn ftrain --j status; echo "options: ${{COMPREPLY[*]}}"
"""
    done = subprocess.run(["bash", "--norc", "-c", probe], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"complete .*-F \S+ ftrain", lines[0]), lines[0]
    assert sorted(lines[1].removeprefix("subcommands: ").split()) == ["status", "storage"]
    assert lines[2].removeprefix("options: ").split() == ["--json"]
    zsh = subprocess.run([FTRAIN, "completion", "zsh"], capture_output=True, text=True, check=True).stdout
    assert zsh.startswith("#compdef ftrain") and "_shtab_ftrain_status_options=(" in zsh


def test_every_recording_command_prints_one_json_object(cli: Cli) -> None:
    code, out, err = cli(
        "launch", "JPCP", "--nodes", "2", "--gpus-per-node", "4", "--nodelist", "node[07-08]", "--json"
    )
    assert (code, err.splitlines()[0]) == (
        0,
        f"Launched {RUN} — 2×4 GPUs, fsdp, rdzv node07:29500",
    )  # for people
    launched = json.loads(out)
    assert (launched["run_id"], launched["event_type"], launched["seq"]) == (RUN, "launched", 1)
    assert (
        launched["devices"] == "gpu"
        and launched["procs_per_node"] == 4
        and launched["command"][0] == "torchrun"
    )
    state = '{"step": 5}'
    [line] = cli.ok(
        "checkpoint", RUN, "--step", "5", "--epoch", "0", "--shards", "8", "--state", state, "--json"
    )
    assert {k: json.loads(line)[k] for k in ("event_type", "step", "seq")} == {
        "event_type": "checkpointed",
        "step": 5,
        "seq": 2,
    }
    [line] = cli.ok("fail", RUN, "--reason", "oom", "--exit-code", "137", "--json")
    assert {k: json.loads(line)[k] for k in ("reason", "exit_code", "failures")} == {
        "reason": "oom",
        "exit_code": 137,
        "failures": 1,
    }
    [line] = cli.ok("resume", RUN, "--json")
    resumed = json.loads(line)
    assert (resumed["step"], resumed["attempt"], resumed["skipped"]) == (5, 2, [])
    [line] = cli.ok("complete", RUN, "--cost-gpu-hours", "3", "--json")
    assert {k: json.loads(line)[k] for k in ("cost_hours", "cost_unit", "cost_source")} == {
        "cost_hours": 3.0, "cost_unit": "GPU-hours", "cost_source": "reported"}  # fmt: skip
    [line] = cli.ok("keys", "show", "--json")
    assert json.loads(line)["public_key"].startswith("ed25519:") and "trusted" in json.loads(line)
    # list rows leave the launch event (and every checkpoint) out unless asked
    [row] = json.loads(cli.ok("list", "--json")[0])
    assert "launch" not in row and "checkpoints" not in row and row["last_valid_checkpoint"]["step"] == 5
    assert row["cost_unit"] == "GPU-hours" and re.fullmatch(r"20\d\d-.*Z", row["updated_at"])
    [whole] = json.loads(cli.ok("list", "--json", "--with-launch")[0])
    assert whole["launch"]["hosts"] == ["node07", "node08"]


def test_server_and_storage_status_json_when_nothing_runs(tmp_path: Path) -> None:
    env = {"FTRAIN_HOME": str(tmp_path / "home"), "FTRAIN_NATS_URL": "", "FTRAIN_STORAGE": ""}
    for what in ("server", "storage"):
        done = ftrain_process([what, "status", "--json"], env)
        assert (done.returncode, json.loads(done.stdout)) == (
            3,
            {"running": False, "home": str(tmp_path / "home")},
        )


@pytest.mark.parametrize(
    "argv", [["events", "tail", "--json"], ["list"], ["--help"], ["events", "schema"], ["completion", "bash"]]
)
def test_a_closed_pipe_ends_the_command_quietly(cli: Cli, env: dict[str, str], argv: list[str]) -> None:
    launch(cli)
    read, write = os.pipe()
    os.close(read)  # the reader (`head -1`) is gone before the first line
    try:
        done = subprocess.run([FTRAIN, *argv], stdout=write, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **env}, check=False, timeout=60)  # fmt: skip
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0 if argv == ["--help"] else 141, "")  # argparse: help, then 0


def test_a_real_head_pipeline_ends_quietly(cli: Cli, env: dict[str, str]) -> None:
    launch(cli)
    for step in range(1, 4):
        checkpoint(cli, step * 10, 0)
    done = subprocess.run(["bash", "-o", "pipefail", "-c", f"{FTRAIN} events tail --json | head -1"],
                          capture_output=True, text=True, env={**os.environ, **env}, check=False)  # fmt: skip
    assert json.loads(done.stdout)["event_type"] == "launched"
    assert done.stderr == "" and done.returncode in (0, 141)


def test_every_human_view_shows_rfc3339_times_with_a_zone(cli: Cli) -> None:
    launch(cli)
    status = cli.ok("status", RUN)
    assert [re.fullmatch(rf"(launched|updated) +{TIME}", line) is not None for line in status].count(
        True
    ) == 2
    assert re.search(rf"  {TIME}  ", cli.ok("list")[1])
    for argv in (("events", "tail"), ("replay",)):
        assert re.match(rf"#1 +{TIME}  {RUN}  seq 1 ", cli.ok(*argv)[0])


@pytest.mark.parametrize(
    "text", ["1m1h", "1h1h", "0s", "400d", "10:60", "1-24:00:00", "00:00", "0steps", "h"]
)
def test_a_bad_or_unbounded_cadence_is_exit_2_and_writes_nothing(cli: Cli, text: str) -> None:
    before = cli.last_seq()
    code, out, err = cli("launch", "P", "--nodes", "1", "--gpus-per-node", "1", "--checkpoint-every", text)
    assert (code, out, cli.last_seq()) == (2, "", before)
    assert err.startswith(f"ftrain launch: error: --checkpoint-every {text!r}: ") and err.count("\n") == 1


def test_a_cadence_is_recorded_as_seconds(cli: Cli) -> None:
    launch(cli, "--checkpoint-every", "1:30:00")
    policy = json.loads(cli.ok("status", RUN, "--json")[0])["launch"]["checkpoint_policy"]
    assert policy == {"text": "1:30:00", "seconds": 5400.0, "steps": None}


def test_an_unknown_key_is_not_found_exit_1(cli: Cli) -> None:
    assert cli("keys", "revoke", "nobody@nowhere") == (
        1,
        "",
        "ftrain keys: no trusted key matches 'nobody@nowhere'\n",
    )


def test_read_only_commands_never_start_the_embedded_server_and_writers_say_they_did(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"FTRAIN_HOME": str(home), "FTRAIN_NATS_URL": "", "FTRAIN_STORAGE": str(tmp_path / "ckpt")}
    try:
        for argv in (
            ["list"],
            ["status", "r"],
            ["events", "tail"],
            ["audit", "verify"],
            ["cost"],
            ["replay"],
            ["metrics"],
            ["ui"],
        ):
            done = ftrain_process(argv, env)
            assert (done.returncode, done.stdout) == (1, ""), done.stderr
            assert done.stderr == (
                f"ftrain {argv[0]}: the embedded nats-server is not running (its log: {home}/nats/store); "
                "start it with `ftrain server start`, or point FTRAIN_NATS_URL at a running one\n"
            )
        assert server_status(home) is None and not (home / "metrics.token").exists()
        first = ftrain_process(
            ["launch", "P", "--nodes", "1", "--gpus-per-node", "1", "--nodelist", "n1"], env
        )
        assert first.returncode == 0
        assert re.fullmatch(
            rf"ftrain: started the embedded nats-server at nats://127\.0\.0\.1:\d+ \(log {home}/nats/store; "
            r"`ftrain server stop` stops it\)\n",
            first.stderr,
        )
        again = ftrain_process(
            ["launch", "P", "--nodes", "1", "--gpus-per-node", "1", "--nodelist", "n1"], env
        )
        assert (again.returncode, again.stderr) == (0, "")  # once: the server runs now
        assert ftrain_process(["list"], env).returncode == 0
        stop_server(home)
        assert ftrain_process(["list"], env).returncode == 1
        assert server_status(home) is None
    finally:
        stop_server(home)


def test_a_cpu_job_is_costed_in_node_hours_or_cpu_hours(cli: Cli) -> None:
    lines = cli.ok(
        "launch", "P", "--nodes", "1", "--nproc-per-node", "2", "--strategy", "ddp", "--nodelist", "n1"
    )
    assert lines[0] == "Launched dist-P-1x2-ddp — 1×2 processes on CPUs, ddp, rdzv n1:29500"
    assert "--nproc_per_node=2" in lines[1]
    [done] = cli.ok("complete", "dist-P-1x2-ddp")
    assert re.fullmatch(
        r"Completed dist-P-1x2-ddp — \d+\.\d\d node-hours \(running wall time × nodes\)", done
    )
    assert any(re.fullmatch(r"node-hours  \d+\.\d\d", line) for line in cli.ok("status", "dist-P-1x2-ddp"))
    cli.ok("launch", "P", "--nodes", "1", "--cpus-per-node", "32", "--strategy", "none", "--nodelist", "n1")
    cost = json.loads(cli.ok("cost", "--json")[0])
    units = {r["run_id"]: (r["cost_unit"], r["gpu_hours"]) for r in cost["runs"]}
    assert units == {"dist-P-1x2-ddp": ("node-hours", 0.0), "dist-P-1x1-none": ("CPU-hours", 0.0)}
    assert set(cost["totals"]) == {"GPU-hours", "node-hours", "CPU-hours"} and cost["total_gpu_hours"] == 0.0
    code, out, err = cli("launch", "P", "--nodes", "1", "--gpus-per-node", "1", "--cpus-per-node", "4")
    assert (code, out) == (2, "") and err.startswith("ftrain launch: error: --cpus-per-node costs a CPU job")


def test_the_library_never_writes_to_stdout_and_keeps_a_users_structlog(tmp_path: Path) -> None:
    """A script that starts (then reuses) the embedded server through the library: ftrain logs an info and a
    debug line. Unconfigured: nothing on stdout or stderr; FTRAIN_LOG_LEVEL=info: on stderr; a structlog the
    user configured first: where the user sent it."""
    home = tmp_path / "home"
    script = (
        "import sys\n"
        "if sys.argv[1] == 'user':\n"
        "    import structlog; structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stdout))\n"
        "from ftrain.events.jetstream.nats_server import ensure_server\n"
        f"ensure_server({str(home)!r}); ensure_server({str(home)!r})\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTRAIN_")}
    try:
        quiet = subprocess.run(
            [sys.executable, "-c", script, "plain"], capture_output=True, text=True, env=env, check=True
        )
        assert (quiet.stdout, quiet.stderr) == ("", "")
        told = subprocess.run([sys.executable, "-c", script, "plain"], capture_output=True, text=True,
                              env={**env, "FTRAIN_LOG_LEVEL": "debug"}, check=True)  # fmt: skip
        assert told.stdout == "" and "nats_server.reused" in told.stderr
        theirs = subprocess.run(
            [sys.executable, "-c", script, "user"], capture_output=True, text=True, env=env, check=True
        )
        assert "nats_server.reused" in theirs.stdout and theirs.stderr == ""
    finally:
        stop_server(home)


def test_log_only_commands_load_neither_the_supervisor_nor_rich(cli: Cli, env: dict[str, str]) -> None:
    launch(cli)
    heavy = ("rich", "aiohttp", "boto3", "ftrain.supervise.supervisor", "ftrain.cli.launch", "torch")
    code = (
        "import sys\nfrom ftrain.cli.main import main\ncode = main(sys.argv[1:])\n"
        f"print(*[m for m in {heavy!r} if m in sys.modules])\nsys.exit(code)"
    )
    for argv in (["status", RUN], ["list"], ["events", "tail"]):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                              env={**os.environ, **env}, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "", (argv, done.stdout.splitlines()[-1])
    parsed = subprocess.run([sys.executable, "-c", "import sys, ftrain.cli.main\nprint(sorted(m for m in "
                             "('nats', 'asyncio', 'structlog', 'rich', 'ftrain.service') if m in sys.modules))"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert parsed.stdout == "[]\n"


@pytest.mark.parametrize(
    ("url", "websockets"), [("nats://127.0.0.1:4222", False), ("wss://127.0.0.1:443", True)]
)
def test_nats_keeps_its_websocket_transport_only_for_a_websocket_url(url: str, websockets: bool) -> None:
    """aiohttp (0.09 s, installed beside mlflow) is left out of nats-py unless the log is reached over ws(s)."""
    pytest.importorskip("aiohttp")
    code = (
        "from ftrain.cli.main import _light_imports\n_light_imports()\n"
        "import nats.aio.transport as t, sys\nprint(t.aiohttp is not None, 'aiohttp' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "FTRAIN_NATS_URL": url})  # fmt: skip
    assert done.stdout == f"{websockets} {websockets}\n", done.stderr


@pytest.mark.parametrize("redirect", [">&-", ">/dev/full"])
@pytest.mark.parametrize(
    "argv",
    [["status", RUN], ["status", RUN, "--json"], ["list"], ["events", "tail", "--json"], ["events", "schema"],
     ["--version"], ["completion", "bash"], ["audit", "verify", RUN], ["keys", "show"]],
)  # fmt: skip
def test_output_that_cannot_be_written_is_one_line_and_exit_1(
    cli: Cli, env: dict[str, str], argv: list[str], redirect: str
) -> None:
    """Stdout closed or a full device: no reader went away (that is exit 141, quietly), the output was lost,
    so the command says so in one line and fails (issue 32) — never a traceback."""
    launch(cli)
    done = subprocess.run(["bash", "-c", f'exec "$@" {redirect}', "-", FTRAIN, *argv], stderr=subprocess.PIPE,
                          text=True, env={**os.environ, **env}, check=False, timeout=60)  # fmt: skip
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    command = "ftrain" if argv == ["--version"] else f"ftrain {argv[0]}"
    assert re.fullmatch(rf"{command}: cannot write the output: .+", line), line
