"""Nodes on one machine: Linux network namespaces on a bridge, each with its own address, host name, FTRAIN_HOME
and processes — the harness the multi-node tests use, and a tool to try a cluster by hand (root only).

    python scripts/cluster.py up --nodes 3 --work /tmp/c     # prints each node's name and address
    python scripts/cluster.py exec --work /tmp/c node2 -- ftrain status
    python scripts/cluster.py nats --work /tmp/c               # a 3-server JetStream cluster, one per node
    python scripts/cluster.py down --work /tmp/c               # also after a crash: removes all it made

A node is a namespace `<tag>-nodeN` joined by a veth pair to the bridge `<tag>-br` (10.77.<net>.0/24, the host
at .1, node N at .10+N). Commands run in it under their own UTS namespace, so each node has its own host name
(`nodeN`), and with an /etc/hosts of its own (`/etc/netns/<ns>/hosts`) naming every node; the file system and
the process table are shared, as on NFS-mounted nodes seen by one root. Each node's NATS server listens on a
second address of the node, on a subnet of its own (10.78.<net>.10+N), so its traffic leaves from that address.
A partition is a link set down (`cut`), healed with `heal`; `cut_nats` parts a node from every other node's NATS
server with blackhole routes and rules in its namespace while its link, and training over it, stay up (`heal_nats`); no
firewall or tc netem is needed (this kernel has no sch_netem). `throttle` shapes a node's link to a rate with tc's
htb both ways (the whole link, or one server's port on it), as a shared file system or object store behind a
network is slower than node memory, and `crossed` counts the bytes that went through the shaped class. Each node
has its own memory directory, a private tmpfs directory (`/dev/shm/<tag>/<node>`, FTRAIN_MEMORY_DIR on it), that
outlives its processes as node memory does, and `start_s3` serves S3 (a moto server) from a node. Everything made
is named by the tag and recorded in `<work>/cluster.json`, so `down` (or `sweep`) removes it even after a failed
test: processes first (every pid in each namespace), then namespaces (their routes with them), veths, the bridge
and the memory directories.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE = "cluster.json"
NATS_CLIENT_PORT = 4222
NATS_ROUTE_PORT = 6222
S3_PORT = 9000
MEMORY = Path("/dev/shm")
"""Where each cluster's node memory lives: `<MEMORY>/<tag>/<node>` (a tmpfs, as a node's memory tier would be)."""
SHAPED = "1:10"
"""The htb class `throttle` sends the shaped traffic through (the rest goes through 1:20, unshaped)."""
CUT_RULE_PREF = 100
LOCAL_RULE_PREF = 200


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"ftprobe-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


NETS = range(100, 250)
"""The third octet of a cluster's subnets, 10.77.<net>.0/24 and 10.78.<net>.0/24."""


def free_net() -> int:
    """A random `net` whose subnets no interface of the host holds: a bridge left by another cluster, or by a
    crashed run, would take the traffic meant for this one."""
    held = {
        int(n) for n in re.findall(r"\b10\.7[78]\.(\d+)\.", _ip("-o", "addr", "show", check=False).stdout)
    }
    free = [n for n in NETS if n not in held]
    if not free:
        raise RuntimeError(f"every subnet 10.77-78.{NETS.start}-{NETS.stop - 1}.0/24 is in use on this host")
    return random.choice(free)


@dataclass
class Cluster:
    """`count` nodes under `work` (each node's FTRAIN_HOME is `<work>/<node>/home`)."""

    work: Path
    count: int
    tag: str = field(default_factory=lambda: f"ft{uuid.uuid4().hex[:5]}")
    net: int = field(default_factory=free_net)
    nats: dict[str, int] = field(default_factory=dict)
    """The pid of each node's nats-server, by node."""

    @property
    def nodes(self) -> list[str]:
        return [f"node{n}" for n in range(1, self.count + 1)]

    def namespace(self, node: str) -> str:
        return f"{self.tag}-{node}"

    def address(self, node: str) -> str:
        return f"10.77.{self.net}.{10 + int(node.removeprefix('node'))}"

    def nats_address(self, node: str) -> str:
        """Where `node`'s NATS server listens: a second address, on a subnet of its own, so the server's traffic
        (its routes' too) leaves from it and `cut_nats` can part it from the training traffic on one link."""
        return f"10.78.{self.net}.{10 + int(node.removeprefix('node'))}"

    @property
    def bridge(self) -> str:
        return f"{self.tag}-br"

    def _veth(self, node: str) -> str:
        return f"{self.tag}-v{node.removeprefix('node')}"  # at most 15 characters

    def home(self, node: str) -> Path:
        """`node`'s FTRAIN_HOME (what `node_exec` sets there)."""
        return self.work / node / "home"

    def memory(self, node: str) -> Path:
        """`node`'s memory directory (FTRAIN_MEMORY_DIR there): private, on a tmpfs, gone with the cluster."""
        return MEMORY / self.tag / node

    # -- lifecycle -----------------------------------------------------------------------------------------

    def up(self) -> Cluster:
        """Make the bridge and the nodes; record them first, so a failure half-way is still cleaned."""
        self.work.mkdir(parents=True, exist_ok=True)
        self.save()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"10.77.{self.net}.1/24", "dev", self.bridge)
        _ip("addr", "add", f"10.78.{self.net}.1/24", "dev", self.bridge)  # the host reaches the NATS servers
        _ip("link", "set", self.bridge, "up")
        for node in self.nodes:
            ns, veth = self.namespace(node), self._veth(node)
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            _ip("link", "set", f"{veth}p", "netns", ns)
            _ip("-n", ns, "link", "set", f"{veth}p", "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.nats_address(node)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            # local delivery looked up after `cut_nats`'s rules (pref 0 would accept first what they drop)
            _ip("-n", ns, "rule", "add", "pref", str(LOCAL_RULE_PREF), "lookup", "local")
            _ip("-n", ns, "rule", "del", "pref", "0")
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            self.home(node).mkdir(parents=True, exist_ok=True)
            self.memory(node).mkdir(mode=0o700, parents=True, exist_ok=True)
            self.memory(node).parent.chmod(0o700)
            hosts = Path("/etc/netns") / ns / "hosts"  # `ip netns exec` mounts it over /etc/hosts
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(
                "127.0.0.1 localhost\n" + "".join(f"{self.address(n)} {n}\n" for n in self.nodes)
            )
        return self

    def down(self) -> None:
        """Kill every process in the nodes, then remove the namespaces, veths and bridge (what is there)."""
        for node in self.nodes:
            ns = self.namespace(node)
            _kill_all(ns)
            _ip("netns", "del", ns, check=False)
            _ip("link", "del", self._veth(node), check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        _ip("link", "del", self.bridge, check=False)
        shutil.rmtree(MEMORY / self.tag, ignore_errors=True)
        (self.work / STATE).unlink(missing_ok=True)

    def save(self) -> None:
        (self.work / STATE).write_text(json.dumps({**asdict(self), "work": str(self.work)}))

    @classmethod
    def load(cls, work: Path) -> Cluster:
        raw: dict[str, Any] = json.loads((work / STATE).read_text())
        return cls(Path(raw["work"]), raw["count"], raw["tag"], raw["net"], raw.get("nats", {}))

    # -- running -------------------------------------------------------------------------------------------

    def node_exec(self) -> str:
        """The `ftrain run --node-exec` template that starts a command on a node of this cluster (node names
        resolve there: each namespace has its own /etc/hosts), with that node's own FTRAIN_HOME and memory
        directory, as a login on the node would have them (`ip netns exec` would pass on the caller's)."""
        home = shlex.quote(f"FTRAIN_HOME={self.work}/{{host}}/home")
        memory = shlex.quote(f"FTRAIN_MEMORY_DIR={MEMORY / self.tag}/{{host}}")
        return (
            f"ip netns exec {self.tag}-{{host}} unshare --uts sh -c 'hostname {{host}} && exec \"$@\"' sh "
            f"env {home} {memory}"
        )

    def command(self, node: str, argv: Sequence[str]) -> list[str]:
        """`argv` run on `node`: in its namespace, under its own host name (the template, filled in)."""
        return [*(shlex.split(self.node_exec().replace("{host}", node))), *argv]

    def env(self, node: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a process on `node`: its own FTRAIN_HOME and memory directory."""
        own = {"FTRAIN_HOME": str(self.home(node)), "FTRAIN_MEMORY_DIR": str(self.memory(node))}
        return {**os.environ, **own, **(extra or {})}

    def popen(self, node: str, argv: Sequence[str], extra: Mapping[str, str] | None = None, **kw: Any) -> Any:
        return subprocess.Popen(self.command(node, argv), env=self.env(node, extra), **kw)

    def run(
        self, node: str, argv: Sequence[str], extra: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(node, argv),
            env=self.env(node, extra),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def cut(self, node: str) -> None:
        """Partition `node`: its link to the bridge goes down (its processes keep running)."""
        _ip("link", "set", self._veth(node), "down")

    def heal(self, node: str) -> None:
        _ip("link", "set", self._veth(node), "up")

    def cut_nats(self, node: str) -> None:
        """Cut `node` off from every other node's NATS server while its link stays up (training traffic flows):
        in its namespace, packets to their addresses are dropped (a blackhole route) and so are packets from
        them (a blackhole rule, looked up before local delivery), so nothing passes either way, not even into a
        socket's buffer. Its own server, reachable on the node (and from the host), is cut off with it."""
        ns = self.namespace(node)
        for other in self.nodes:
            if other != node:
                _ip("-n", ns, "route", "add", "blackhole", f"{self.nats_address(other)}/32")
                _ip("-n", ns, "rule", "add", "pref", str(CUT_RULE_PREF), "from", self.nats_address(other),
                    "blackhole")  # fmt: skip

    def heal_nats(self, node: str) -> None:
        """Undo `cut_nats` (whatever of it is there)."""
        ns = self.namespace(node)
        for other in self.nodes:
            if other != node:
                _ip("-n", ns, "route", "del", "blackhole", f"{self.nats_address(other)}/32", check=False)
                _ip("-n", ns, "rule", "del", "pref", str(CUT_RULE_PREF), "from", self.nats_address(other),
                    "blackhole", check=False)  # fmt: skip

    def _links(self, node: str) -> list[tuple[list[str], str]]:
        """The two ends of `node`'s link, each as the `tc` options that reach its namespace and its device:
        its eth0 (what leaves the node), and the bridge's veth to it (what the node receives)."""
        return [(["-n", self.namespace(node)], "eth0"), ([], self._veth(node))]

    def throttle(self, node: str, rate: str, port: int | None = None) -> None:
        """Shape `node`'s link to `rate` (tc's units: `5mbps` is 5 MB/s, `800mbit` 100 MB/s) each way, with an
        htb class on both ends; with `port`, only the TCP traffic of a server on the node at that port is
        shaped (its replies as they leave, its requests as they arrive), the rest of the link stays as fast."""
        for (ns, dev), matched in zip(self._links(node), ("sport", "dport"), strict=True):
            default = "10" if port is None else "20"
            _tc(*ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", default)
            for classid, limit in ((SHAPED, rate), ("1:20", "100gbit")):
                _tc(*ns, "class", "add", "dev", dev, "parent", "1:", "classid", classid, "htb", "rate", limit)
            if port is not None:
                _tc(*ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "u32",
                    "match", "ip", matched, str(port), "0xffff", "flowid", SHAPED)  # fmt: skip

    def unthrottle(self, node: str) -> None:
        """Undo `throttle` (whatever of it is there); its counts go with it."""
        for ns, dev in self._links(node):
            _tc(*ns, "qdisc", "del", "dev", dev, "root", check=False)

    def crossed(self, node: str) -> int:
        """Bytes sent through `node`'s shaped class, both ways together, since `throttle`."""
        total = 0
        for ns, dev in self._links(node):
            shown = _tc(*ns, "-s", "class", "show", "dev", dev, "classid", SHAPED).stdout
            total += sum(int(n) for n in re.findall(r"Sent (\d+) bytes", shown))
        return total

    def pids(self, node: str) -> list[int]:
        """Every process on `node` (in its network namespace), its NATS server included."""
        return _pids(self.namespace(node))

    def crash(self, node: str) -> None:
        """`node` fails as a machine does: its link goes down, then every process on it is SIGKILLed (its NATS
        server too: `start_nats` brings that back on its store, once `heal` has brought the link up)."""
        self.cut(node)
        self.nats.pop(node, None)
        self.save()
        _kill_all(self.namespace(node))

    # -- S3 on a node -------------------------------------------------------------------------------------------

    def start_s3(self, node: str, port: int = S3_PORT, timeout: float = 30.0) -> str:
        """Serve S3 from `node` (a moto server on its address, its objects in its memory, any keys admitted),
        killed with the node's processes; the endpoint's URL."""
        log = open(self.work / node / "s3.log", "ab")  # noqa: SIM115 - the server's for its life
        server = Path(sys.executable).with_name("moto_server")
        self.popen(node, [str(server), "-H", self.address(node), "-p", str(port)], stdout=log, stderr=log,
                   start_new_session=True)  # fmt: skip
        _wait_port(self.address(node), port, timeout)
        return f"http://{self.address(node)}:{port}"

    # -- a NATS JetStream cluster, one server per node ---------------------------------------------------------

    def nats_urls(self, nodes: Sequence[str] | None = None) -> str:
        return ",".join(f"nats://{self.nats_address(n)}:{NATS_CLIENT_PORT}" for n in nodes or self.nodes)

    def nats_seed(self) -> Path:
        """The user nkey seed every client signs in with (0600), shared as an operator would distribute it."""
        return self.work / "nats-user.nk"

    def start_nats(self, node: str, timeout: float = 20.0) -> None:
        """Start (or restart, on the same store) `node`'s nats-server, routed to every other node's."""
        import nkeys  # nats-py[nkeys]

        seed = self.nats_seed()
        if not seed.exists():
            raw = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
            fd = os.open(seed, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
        user = nkeys.from_seed(bytearray(seed.read_bytes())).public_key.decode()
        directory = self.work / node / "nats"
        directory.mkdir(parents=True, exist_ok=True)
        routes = ", ".join(
            json.dumps(f"nats://{self.nats_address(n)}:{NATS_ROUTE_PORT}") for n in self.nodes if n != node
        )
        conf = directory / "server.conf"
        conf.write_text(
            "\n".join(
                [
                    f"server_name: {json.dumps(node)}",
                    f"listen: {json.dumps(f'{self.nats_address(node)}:{NATS_CLIENT_PORT}')}",
                    f"authorization {{ users = [ {{ nkey: {json.dumps(user)} }} ] }}",
                    # a peer cut off without closing its routes is dropped after a few seconds, not minutes:
                    # until then requests may still be routed to its subscribers (its stream replica's)
                    'ping_interval: "2s"',
                    "ping_max: 2",
                    "jetstream {",
                    f"  store_dir: {json.dumps(str(directory / 'store'))}",
                    "  sync_interval: always",
                    "}",
                    "cluster {",
                    '  name: "ftrain"',
                    f"  listen: {json.dumps(f'{self.nats_address(node)}:{NATS_ROUTE_PORT}')}",
                    f"  routes: [{routes}]",
                    "}",
                    "",
                ]
            )
        )
        log = open(directory / "server.log", "ab")  # noqa: SIM115 - the server's for its life
        binary = Path(sys.executable).with_name("nats-server")
        proc = self.popen(node, [str(binary if binary.exists() else "nats-server"), "-c", str(conf)],
                          stdout=log, stderr=log, start_new_session=True)  # fmt: skip
        self.nats[node] = proc.pid
        self.save()
        _wait_port(self.nats_address(node), NATS_CLIENT_PORT, timeout)

    def stop_nats(self, node: str) -> None:
        """SIGKILL `node`'s nats-server (its store stays for a restart)."""
        pid = self.nats.pop(node, None)
        self.save()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        _wait_gone(pid)

    def pause_nats(self, node: str) -> None:
        """SIGSTOP `node`'s nats-server (`resume_nats` wakes it). Alone it misses nothing: the kernel keeps
        receiving for it and it catches up on waking; `cut_nats` as well makes it miss what the others agree on."""
        os.killpg(self.nats[node], signal.SIGSTOP)

    def resume_nats(self, node: str) -> None:
        os.killpg(self.nats[node], signal.SIGCONT)

    def nats_env(self, replicas: int = 3) -> dict[str, str]:
        """What a client sets to use the cluster: every URL, the seed, replicated streams."""
        return {
            "FTRAIN_NATS_URL": self.nats_urls(),
            "FTRAIN_NATS_NKEY": str(self.nats_seed()),
            "FTRAIN_STREAM_REPLICAS": str(replicas),
        }


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["tc", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)}: {done.stderr.strip()}")
    return done


def _pids(ns: str) -> list[int]:
    return [int(pid) for pid in _ip("netns", "pids", ns, check=False).stdout.split() if pid.isdigit()]


def _kill_all(ns: str) -> None:
    """SIGKILL every process in namespace `ns`, and wait until none is left (the dead reaped by their parents)."""
    for pid in _pids(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in _pids(ns):
        _wait_gone(pid)


def _wait_port(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{host}:{port} did not answer within {timeout:.0f} s") from None
            time.sleep(0.1)


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    """Until `pid` is dead: reaped (ours are reaped here), or a zombie its parent has yet to reap."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.05)


def sweep(prefix: str = "ft") -> list[str]:
    """Remove every namespace, bridge and memory directory named `<prefix>…-node…`/`<prefix>…-br`/`<prefix>…`
    left by crashed runs."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns.startswith(prefix) and "-node" in ns:
            _kill_all(ns)
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
            removed.append(ns)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(prefix) and name.endswith("-br"):
            _ip("link", "del", name, check=False)
            removed.append(name)
            if (MEMORY / name.removesuffix("-br")).is_dir():
                shutil.rmtree(MEMORY / name.removesuffix("-br"), ignore_errors=True)
                removed.append(str(MEMORY / name.removesuffix("-br")))
    return removed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    up = sub.add_parser("up")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--work", type=Path, required=True)
    for verb in ("down", "nats"):
        sub.add_parser(verb).add_argument("--work", type=Path, required=True)
    run = sub.add_parser("exec")
    run.add_argument("--work", type=Path, required=True)
    run.add_argument("node")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    sub.add_parser("sweep")
    args = parser.parse_args(argv)
    if args.verb != "sweep" and (why := unavailable()):
        print(f"cluster: {why}", file=sys.stderr)
        return 2
    if args.verb == "up":
        cluster = Cluster(args.work.resolve(), args.nodes).up()
        for node in cluster.nodes:
            print(f"{node} {cluster.address(node)} FTRAIN_HOME={cluster.home(node)}")
    elif args.verb == "down":
        Cluster.load(args.work.resolve()).down()
    elif args.verb == "nats":
        cluster = Cluster.load(args.work.resolve())
        for node in cluster.nodes:
            cluster.start_nats(node)
        print(" ".join(f"{k}={v}" for k, v in cluster.nats_env().items()))
    elif args.verb == "exec":
        argv_ = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        cluster = Cluster.load(args.work.resolve())
        return subprocess.call(cluster.command(args.node, argv_), env=cluster.env(args.node))
    else:
        print("\n".join(sweep()) or "nothing to remove")
    return 0


if __name__ == "__main__":
    sys.exit(main())
