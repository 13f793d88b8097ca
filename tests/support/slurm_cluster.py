"""A real Slurm for tests: Debian's slurmctld, slurmd and munge, run as root under a temporary directory, on this
host alone (`slurm`, one node) or with one slurmd per network namespace (`slurm2`, two nodes, each with its own
address and host name). The recipe and its pitfalls are in the shared DESIGN ("A real Slurm on this machine").

Every process the harness starts (munged, the daemons, and through them every job step) carries
`FTRAIN_SLURM_HARNESS=<work dir>` in its environment, so teardown finds and SIGKILLs them all, after a failed
test too; the namespaces, the bridge and the /etc/hosts lines go with them. Tests that need Slurm skip with one
reason where the machine cannot run it, and fail instead under FTRAIN_REQUIRE_SLURM=1 (CI)."""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.netns import cluster as netns_cluster

MARK = "FTRAIN_SLURM_HARNESS"
DAEMONS = ("slurmctld", "slurmd", "srun", "sbatch", "scontrol", "scancel", "munged", "nsenter")
HOSTS = Path("/etc/hosts")
VENV_BIN = str(Path(sys.executable).parent)
CRED_EXPIRE = 10
"""Seconds a job credential lives (`AuthInfo=cred_expire`); a killed job's revoked one is held as long."""


def unavailable() -> str | None:
    """Why a real Slurm cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "a real Slurm needs root (slurmd runs jobs as their users)"
    missing = [
        name for name in DAEMONS if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists()
    ]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurmctld slurmd slurm-client munge)"
    if not Path("/etc/munge/munge.key").exists():
        return "/etc/munge/munge.key is missing (the munge package makes it)"
    return None


def require_slurm(nodes: int = 1) -> None:
    """Skip (or, with FTRAIN_REQUIRE_SLURM=1, fail) unless a real Slurm of `nodes` nodes can run here."""
    why = unavailable() or (netns_cluster.unavailable() if nodes > 1 else None)
    if why is None:
        return
    if os.environ.get("FTRAIN_REQUIRE_SLURM") == "1":
        pytest.fail(f"Slurm tests required (FTRAIN_REQUIRE_SLURM=1) but {why}")
    pytest.skip(f"Slurm tests: {why}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def marked(work: Path) -> list[int]:
    """Every live process started under the harness at `work` (by the mark in its environment)."""
    mark = f"{MARK}={work}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class Slurm:
    """One Slurm cluster under `work`: `count` nodes, on this host (`netns=False`) or one per namespace."""

    def __init__(self, work: Path, count: int = 1, *, netns: bool = False, kill_wait: int = 10) -> None:
        self.work = work
        self.tag = f"fs{uuid.uuid4().hex[:5]}"
        self.nodes = [f"{self.tag}n{n}" for n in range(1, count + 1)]
        self.conf = work / "slurm.conf"
        self.kill_wait = kill_wait
        self.ns = netns_cluster.Cluster(work / "netns", count) if netns else None
        self.procs: list[subprocess.Popen[bytes]] = []

    # -- addresses ---------------------------------------------------------------------------------------

    @property
    def controller_addr(self) -> str:
        """Where jobs and clients reach slurmctld: the bridge's host address, or loopback."""
        return f"10.77.{self.ns.net}.1" if self.ns else "127.0.0.1"

    def addr(self, node: str) -> str:
        return self.ns.address(self._ns_node(node)) if self.ns else "127.0.0.1"

    def _ns_node(self, node: str) -> str:
        return f"node{self.nodes.index(node) + 1}"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a Slurm client here (and, through sbatch's --export=ALL, of its jobs): the
        configuration, the harness's mark, this venv first on PATH."""
        return {
            **os.environ,
            "SLURM_CONF": str(self.conf),
            MARK: str(self.work),
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            **(extra or {}),
        }

    # -- lifecycle ---------------------------------------------------------------------------------------

    def up(self) -> "Slurm":
        """munged, slurmctld, then one slurmd per node; returns once every node is idle."""
        self.work.mkdir(parents=True, exist_ok=True)
        self.work.chmod(0o755)  # munged wants every directory above its socket searchable
        munge = self.work / "munge"
        munge.mkdir(mode=0o755, exist_ok=True)
        shutil.chown(munge, "munge", "munge")
        self._spawn(
            ["runuser", "-u", "munge", "--", _sbin("munged"), "-F", f"--socket={munge}/sock",
             f"--pid-file={munge}/pid", f"--seed-file={munge}/seed", f"--log-file={munge}/log"],
            "munged",
        )  # fmt: skip
        _wait(lambda: (munge / "sock").exists(), "munged's socket", 10)
        if self.ns is not None:
            self.ns.up()
            self._add_hosts()
        (self.work / "spool").mkdir(exist_ok=True)
        self.ctld_port, self.slurmd_port = free_port(), free_port()
        self.conf.write_text(self._config())
        self._spawn([_sbin("slurmctld"), "-D", "-f", str(self.conf), "-c"], "slurmctld")
        _wait(lambda: "UP" in self.scontrol("ping", check=False).stdout, "slurmctld", 20)
        for node in self.nodes:
            argv = [_sbin("slurmd"), "-D", "-f", str(self.conf), "-N", node]
            if self.ns is not None:  # not `ip netns exec`: it remounts /sys, and slurmd then dies
                netns = f"/run/netns/{self.ns.namespace(self._ns_node(node))}"
                argv = ["nsenter", f"--net={netns}", "unshare", "--uts", "sh", "-c",
                        f'hostname {node} && exec "$@"', "sh", *argv]  # fmt: skip
            self._spawn(argv, f"slurmd-{node}")
        _wait(self._all_idle, "every node idle", 30)
        return self

    def down(self) -> None:
        """Cancel every job, then SIGKILL every process the harness started (jobs included) until none is left;
        remove the namespaces and the /etc/hosts lines."""
        if self.conf.exists():
            subprocess.run(["scancel", "--full", "--signal=KILL", "-u", "root"], env=self.env(),
                           capture_output=True, timeout=20, check=False)  # fmt: skip
        deadline = time.monotonic() + 30
        while left := marked(self.work):
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for proc in self.procs:
                with contextlib.suppress(ChildProcessError):
                    proc.poll()
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {left} of the Slurm harness survived SIGKILL")
            time.sleep(0.1)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        if self.ns is not None:
            self._remove_hosts()
            self.ns.down()

    def _spawn(self, argv: Sequence[str], name: str) -> None:
        log = (self.work / f"{name}.out").open("ab")
        self.procs.append(
            subprocess.Popen(
                argv, env=self.env(), stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
            )
        )

    def _config(self) -> str:
        w = self.work
        if self.ns is not None:
            node_lines = [f"NodeName={n} NodeAddr={self.addr(n)} CPUs=2 RealMemory=1000" for n in self.nodes]
        else:
            node_lines = [
                f"NodeName={n} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000"
                for n in self.nodes
            ]
        return "\n".join(
            [
                f"ClusterName={self.tag}",
                f"SlurmctldHost={socket.gethostname()}({self.controller_addr})",
                f"SlurmctldPort={self.ctld_port}",
                f"SlurmdPort={self.slurmd_port}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                # cred_expire also sets how long a requeued job waits before it may start again (default 120 s)
                f"AuthInfo=socket={w}/munge/sock,cred_expire={CRED_EXPIRE}",
                f"StateSaveLocation={w}/state",
                f"SlurmdSpoolDir={w}/spool/%n",
                f"SlurmctldPidFile={w}/slurmctld.pid",
                f"SlurmdPidFile={w}/slurmd-%n.pid",
                f"SlurmctldLogFile={w}/slurmctld.log",
                f"SlurmdLogFile={w}/slurmd-%n.log",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "AccountingStorageType=accounting_storage/none",
                "JobCompType=jobcomp/filetxt",
                f"JobCompLoc={w}/jobcomp.txt",
                "MpiDefault=none",
                "ReturnToService=2",
                f"KillWait={self.kill_wait}",
                "MinJobAge=600",
                "SlurmdTimeout=15",  # a lost node is found within 15-30 s (srun: "Node failure on …")
                "SchedulerParameters=bf_interval=2",  # a requeued job starts once its begin time passes
                *node_lines,
                f"PartitionName=main Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )

    def _add_hosts(self) -> None:
        """Name every node in /etc/hosts: `nsenter --net` keeps the host's, and torch resolves host names."""
        block = "".join(f"{self.addr(n)} {n}  # {self.tag}\n" for n in self.nodes)
        with HOSTS.open("a") as f:  # in place: /etc/hosts may be a mount point
            f.write(block)

    def _remove_hosts(self) -> None:
        kept = [
            line for line in HOSTS.read_text().splitlines(True) if not line.rstrip().endswith(f"# {self.tag}")
        ]
        HOSTS.write_text("".join(kept))

    def _all_idle(self) -> bool:
        dead = [proc for proc in self.procs if proc.poll() is not None]
        if dead:
            raise RuntimeError(f"{dead[0].args!r} ended:\n{self.logs()}")
        shown = self.scontrol("show", "nodes", "-o", check=False).stdout
        return shown.count("State=IDLE") == len(self.nodes)

    # -- clients -----------------------------------------------------------------------------------------

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["scontrol", *args], env=self.env(), capture_output=True, text=True,
                              timeout=30, check=False)  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {done.stderr.strip()}")
        return done

    def sbatch(self, *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> int:
        """Submit; the job id."""
        done = subprocess.run(["sbatch", "--parsable", *args], env=self.env(env), capture_output=True,
                              text=True, timeout=30, check=False, cwd=cwd)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return int(done.stdout.strip().split(";")[0])

    def scancel(self, *args: str) -> None:
        done = subprocess.run(["scancel", *args], env=self.env(), capture_output=True, text=True, timeout=30,
                              check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr

    def job(self, job: int) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, …)."""
        shown = self.scontrol("show", "job", "-o", str(job)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", shown))

    def wait_job(self, job: int, states: Sequence[str], timeout: float) -> dict[str, str]:
        """Until the job is in one of `states`; its record."""
        seen: dict[str, str] = {}

        def there() -> bool:
            nonlocal seen
            seen = self.job(job)
            return seen.get("JobState") in states

        _wait(there, f"job {job} to be {'/'.join(states)} (last: {seen.get('JobState')})", timeout)
        return seen

    def start_now(self, job: int, ended: float) -> None:
        """A requeued job waits out its begin time (cred_expire) and then the scheduler's next pass; start it
        as soon as slurmd will launch it: once the credential revoked when it ended (at `ended`, epoch
        seconds) has expired. Before that slurmd refuses it ("Job credential revoked") and the job fails."""
        time.sleep(max(0.0, ended + CRED_EXPIRE + 1 - time.time()))
        try:
            self.scontrol("update", f"JobId={job}", "StartTime=now")
        except RuntimeError as exc:  # the scheduler's own pass started it first: what was asked for
            if "no longer pending" not in str(exc):
                raise

    def kill_job_processes(self, job: int) -> list[int]:
        """SIGKILL every process of `job` (the batch shell and all it started, by SLURM_JOB_ID in their
        environment; Slurm's own slurmstepd spared), as the OOM killer or a dying node would: no warning."""
        mark = f"SLURM_JOB_ID={job}".encode()
        killed = []
        for pid in marked(self.work):
            with contextlib.suppress(OSError):
                entry = Path(f"/proc/{pid}")
                if mark in (entry / "environ").read_bytes().split(b"\0") and not (
                    entry / "cmdline"
                ).read_bytes().startswith(b"slurmstepd"):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        return killed

    def kill_node(self, node: str) -> None:
        """`node` fails as a machine does: its link goes down, then every process on it is SIGKILLed."""
        assert self.ns is not None
        self.ns.crash(self._ns_node(node))

    def logs(self) -> str:
        """The daemons' logs' tails, for a failing assertion."""
        parts = []
        for path in sorted(self.work.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)


def _wait(condition: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


def sweep_stale() -> list[Path]:
    """Take down what a harness left behind when its test process was killed (its teardown never ran): every
    marked process whose directory's owner (the pid in `owner`) is gone. Returns those directories."""
    stale: dict[Path, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for item in (entry / "environ").read_bytes().split(b"\0"):
                if item.startswith(f"{MARK}=".encode()):
                    stale.setdefault(Path(item.split(b"=", 1)[1].decode()), []).append(int(entry.name))
    swept = []
    for work, pids in stale.items():
        owner = work / "owner"
        with contextlib.suppress(OSError, ValueError):
            if Path(f"/proc/{int(owner.read_text())}").exists():
                continue
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        swept.append(work)
    return swept


@contextlib.contextmanager
def running(count: int = 1, *, netns: bool = False) -> Iterator[Slurm]:
    """A cluster up for the block, then down and its directory removed. Its directory is a fresh one under /tmp
    (pytest's are private to root, and munged, running as `munge`, must reach its socket)."""
    sweep_stale()
    cluster = Slurm(Path(tempfile.mkdtemp(prefix="ftrain-slurm-")), count, netns=netns)
    (cluster.work / "owner").write_text(str(os.getpid()))
    try:
        yield cluster.up()
    finally:
        cluster.down()
        shutil.rmtree(cluster.work, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    """A one-node Slurm shared by the Slurm tests (each test's jobs end within the test)."""
    require_slurm()
    with running() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm2() -> Iterator[Slurm]:
    """A two-node Slurm, one slurmd per network namespace."""
    require_slurm(nodes=2)
    with running(2, netns=True) as cluster:
        yield cluster
