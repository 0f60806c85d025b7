"""Hosts as network namespaces on one virtual switch, and the network faults between them.

A Topology is one harness run's network: a switch namespace `dlf<run>-sw` holding a bridge,
and one namespace `dlf<run>-<host>` per host whose `eth0` (a veth) has its peer enslaved to
that bridge. Addresses 10.231.<run>.<n>/24 exist only inside the host namespaces; the root
namespace gets no address, route, link or rule, so no traffic ever leaves the machine.

Faults are nftables rules in a table of our own (`inet dlfault`) inside the host namespaces,
so they never touch anyone else's rules; heal() deletes those tables. tc netem is not
available on this kernel, so delay cannot be injected; loss can (`numgen random`).

Ownership: /run/dlock-faults/<run>/pid names the harness (pid and start time) that owns the
namespaces `dlf<run>-*`; cleanup_stale() removes the namespaces of harnesses that are gone.
"""

import atexit
import os
import re
import shutil
import signal
import subprocess
import time

RUN_DIR = "/run/dlock-faults"
TABLE = "dlfault"
# Host names become part of namespace and link names; links are limited to 15 characters.
HOST_NAME = re.compile(r"^[a-z][a-z0-9]{0,9}$")
NS_NAME = re.compile(r"^dlf(\d+)-([a-z0-9]+)$")


def _check_root():
    if os.geteuid() != 0:
        raise PermissionError(
            "the fault harness needs root (network namespaces, veth links, nftables): run it as root"
        )


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/pid/stat): tells a pid reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _owner_alive(run: int) -> bool:
    """Whether the harness named in /run/dlock-faults/<run>/pid still runs."""
    try:
        with open(os.path.join(RUN_DIR, str(run), "pid")) as f:
            pid_s, start = f.read().split()
        pid = int(pid_s)
    except (OSError, ValueError):
        return False
    return _start_time(pid) == start


def _ip(args: list[str], log=None, check: bool = True, timeout: float = 15.0):
    if log:
        log(" ".join(["ip", *args]))
    proc = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def list_namespaces() -> list[str]:
    proc = _ip(["netns", "list"], check=False)
    # Lines look like "name" or "name (id: 3)".
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _ns_pids(ns: str) -> list[int]:
    proc = _ip(["netns", "pids", ns], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def _kill_ns_processes(ns: str, timeout: float = 5.0):
    """SIGKILL whatever still runs inside one of our namespaces, wait (bounded) until gone."""
    deadline = time.monotonic() + timeout
    for _ in range(100):
        pids = _ns_pids(ns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                # Our own children: reap them so they do not stay listed as zombies.
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _delete_ns(ns: str, log=None):
    if ns not in list_namespaces():
        return
    _kill_ns_processes(ns)
    _ip(["netns", "del", ns], log=log, check=False)


def pick_run() -> int:
    """A run number in 1..250 derived from our pid, the first one no live harness owns and no
    namespace uses."""
    return pick_runs(1)[0]


def pick_runs(count: int) -> list[int]:
    """`count` distinct run numbers as pick_run() chooses them, for the parts of a side-by-side
    run (each part claims its own when its Topology starts)."""
    existing = {m.group(1) for m in (NS_NAME.match(n) for n in list_namespaces()) if m}
    base = os.getpid() % 250
    runs = []
    for i in range(250):
        run = (base + i) % 250 + 1
        if str(run) not in existing and not _owner_alive(run):
            runs.append(run)
            if len(runs) == count:
                return runs
    raise RuntimeError("no free run number in 1..250: too many fault harnesses (or stale ones: cleanup_stale())")


def cleanup_stale(log=print) -> list[str]:
    """Remove namespaces `dlf<run>-*` (and the processes inside them) whose owning harness is
    dead, and their /run/dlock-faults/<run> directories. Returns the namespaces removed."""
    _check_root()
    removed = []
    runs = set()
    for ns in list_namespaces():
        m = NS_NAME.match(ns)
        if not m:
            continue
        run = int(m.group(1))
        runs.add(run)
        if _owner_alive(run):
            continue
        _delete_ns(ns)
        removed.append(ns)
    if os.path.isdir(RUN_DIR):
        for entry in os.listdir(RUN_DIR):
            if entry.isdigit() and not _owner_alive(int(entry)):
                shutil.rmtree(os.path.join(RUN_DIR, entry), ignore_errors=True)
    if removed and log:
        log(f"removed stale namespaces of dead fault harnesses: {' '.join(removed)}")
    return removed


def exit_on_signals():
    """Turn SIGTERM and SIGHUP into SystemExit, so try/finally blocks and atexit handlers
    (Topology.close, Deployment.stop) run on them as on Ctrl-C."""

    def handler(signum, _frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


class Host:
    """One host: a network namespace with one interface `eth0` on the switch."""

    def __init__(self, topo: "Topology", name: str, ns: str, addr: str, index: int):
        self.topo = topo
        self.name = name
        self.ns = ns
        self.addr = addr
        self.index = index

    def __repr__(self):
        return f"Host({self.name} {self.addr} ns={self.ns})"

    def cmd(self, argv: list[str]) -> list[str]:
        """argv run inside this host (`ip netns exec` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.ns, *[str(a) for a in argv]]

    def run(self, argv, **kw) -> subprocess.CompletedProcess:
        """Run argv inside this host and wait; bounded by `timeout` (default 30 s; raises
        subprocess.TimeoutExpired). Output captured as text unless told otherwise; check off."""
        kw.setdefault("timeout", 30.0)
        if "stdout" not in kw and "stderr" not in kw:
            kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("check", False)
        return subprocess.run(self.cmd(argv), **kw)


class Topology:
    """One run's switch and hosts. close() removes everything; it is idempotent and also runs
    at interpreter exit."""

    def __init__(self, run: int | None, workdir: str):
        _check_root()
        if run is None:
            run = pick_run()
        if not 1 <= run <= 254:
            raise ValueError(f"run number {run} out of 1..254")
        self.run = run
        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        self._log_path = os.path.join(workdir, "net.log")
        self._hosts: dict[str, Host] = {}
        self._faulted: set[str] = set()
        self.faults: list[str] = []
        self._closed = False
        self.switch_ns = f"dlf{run}-sw"
        run_dir = os.path.join(RUN_DIR, str(run))
        if _owner_alive(run) and not self._owned_by_us(run):
            raise RuntimeError(f"run number {run} belongs to a live fault harness ({run_dir}/pid)")
        # Claim the run number before any namespace exists, so cleanup_stale() of another
        # harness never mistakes ours for a dead one's.
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "pid"), "w") as f:
            f.write(f"{os.getpid()} {_start_time(os.getpid())}\n")
        self._run_dir = run_dir
        atexit.register(self.close)
        for ns in list_namespaces():
            if ns.startswith(f"dlf{run}-"):
                # Left by a dead harness with our run number (we own the number now).
                _delete_ns(ns, log=self._log)
        _ip(["netns", "add", self.switch_ns], log=self._log)
        self._in(self.switch_ns, ["ip", "link", "set", "lo", "up"])
        self._in(
            self.switch_ns,
            ["ip", "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"],
        )
        self._in(self.switch_ns, ["ip", "link", "set", "br0", "up"])

    @staticmethod
    def _owned_by_us(run: int) -> bool:
        try:
            with open(os.path.join(RUN_DIR, str(run), "pid")) as f:
                return int(f.read().split()[0]) == os.getpid()
        except (OSError, ValueError, IndexError):
            return False

    def _log(self, line: str):
        try:
            with open(self._log_path, "a") as f:
                f.write(f"{time.clock_gettime_ns(time.CLOCK_BOOTTIME)} {line}\n")
        except OSError:
            pass

    def _in(self, ns: str, argv: list[str], input: str | None = None):
        self._log(f"[{ns}] {' '.join(argv)}")
        proc = subprocess.run(
            ["ip", "netns", "exec", ns, *argv],
            input=input,
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"[{ns}] {' '.join(argv)}: {proc.stderr.strip()}")
        return proc

    # --- hosts -------------------------------------------------------------------------

    def add_host(self, name: str) -> Host:
        """A new host: namespace, veth `eth0` into the switch, address 10.231.<run>.<n>/24,
        lo up. Names: [a-z][a-z0-9]{0,9}, not "sw"."""
        if self._closed:
            raise RuntimeError("topology closed")
        if not HOST_NAME.match(name) or name == "sw":
            raise ValueError(f"host name {name!r}: want [a-z][a-z0-9]{{0,9}}, not 'sw'")
        if name in self._hosts:
            raise ValueError(f"host {name} exists already")
        index = len(self._hosts) + 1
        if index > 253:
            raise RuntimeError("at most 253 hosts per topology")
        ns = f"dlf{self.run}-{name}"
        addr = f"10.231.{self.run}.{index}"
        peer = f"v{index}-{name}"[:15]
        _ip(["netns", "add", ns], log=self._log)
        host = Host(self, name, ns, addr, index)
        self._hosts[name] = host
        # Both ends are created directly in their namespaces: no link ever exists in the root one.
        _ip(
            ["link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", peer, "netns", self.switch_ns],
            log=self._log,
        )
        self._in(self.switch_ns, ["ip", "link", "set", peer, "master", "br0"])
        self._in(self.switch_ns, ["ip", "link", "set", peer, "up"])
        self._in(ns, ["ip", "link", "set", "lo", "up"])
        self._in(ns, ["ip", "addr", "add", f"{addr}/24", "dev", "eth0"])
        self._in(ns, ["ip", "link", "set", "eth0", "up"])
        return host

    def ensure_host(self, name: str) -> Host:
        """The host `name`, added if it does not exist yet."""
        return self._hosts[name] if name in self._hosts else self.add_host(name)

    def host(self, name: str) -> Host:
        return self._hosts[name]

    def has_host(self, name: str) -> bool:
        return name in self._hosts

    def hosts(self) -> list[Host]:
        return list(self._hosts.values())

    def remove_host(self, name: str):
        """Remove one host (its namespace, the processes left inside it, its link)."""
        host = self._hosts.pop(name, None)
        if host is None:
            return
        self._faulted.discard(name)
        _delete_ns(host.ns, log=self._log)

    def close(self):
        """Kill whatever still runs inside our namespaces, delete them and our run directory.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        for host in list(self._hosts.values()):
            try:
                _delete_ns(host.ns, log=self._log)
            except Exception as e:  # keep removing the others
                self._log(f"close {host.ns}: {e}")
        self._hosts.clear()
        try:
            _delete_ns(self.switch_ns, log=self._log)
        finally:
            if self._owned_by_us(self.run):
                shutil.rmtree(self._run_dir, ignore_errors=True)

    # --- faults ------------------------------------------------------------------------

    def _nft(self, host: Host, rules: list[str], what: str):
        """Add rules (each "input ..." or "output ...") to host's own table, atomically."""
        script = [
            f"table inet {TABLE} {{",
            "  chain input { type filter hook input priority -10; policy accept; }",
            "  chain output { type filter hook output priority -10; policy accept; }",
            "}",
        ]
        for rule in rules:
            chain, body = rule.split(" ", 1)
            script.append(f"add rule inet {TABLE} {chain} {body}")
        self._in(host.ns, ["nft", "-f", "-"], input="\n".join(script) + "\n")
        self._faulted.add(host.name)
        self.faults.append(what)
        self._log(f"fault: {what}")

    def isolate(self, host: Host):
        """Drop all of host's traffic on the switch, both ways (its loopback keeps working)."""
        self._nft(host, ['input iifname "eth0" drop', 'output oifname "eth0" drop'], f"isolate {host.name}")

    def partition(self, side_a: list[Host], side_b: list[Host]):
        """No traffic between any host of side_a and any of side_b, both ways."""
        for this, other in ((side_a, side_b), (side_b, side_a)):
            addrs = ", ".join(h.addr for h in other)
            if not addrs:
                continue
            for h in this:
                self._nft(
                    h,
                    [f"input ip saddr {{ {addrs} }} drop", f"output ip daddr {{ {addrs} }} drop"],
                    f"partition {h.name} from {' '.join(o.name for o in other)}",
                )

    def drop_one_way(self, src: Host, dst: Host):
        """Packets from src to dst are dropped (at src's egress); dst -> src still flows."""
        self._nft(src, [f"output ip daddr {dst.addr} drop"], f"drop {src.name} -> {dst.name}")

    def loss(self, host: Host, percent: int):
        """Each packet in or out of host's eth0 dropped with probability percent/100."""
        if not 0 <= percent <= 100:
            raise ValueError(f"loss percent {percent} out of 0..100")
        # numgen's comparison takes 0..99: 100 % is a plain drop.
        match = "" if percent == 100 else f"numgen random mod 100 < {percent} "
        if percent == 0:
            return
        self._nft(
            host,
            [f'input iifname "eth0" {match}drop', f'output oifname "eth0" {match}drop'],
            f"loss {percent}% {host.name}",
        )

    def heal(self):
        """Undo every fault: delete our table in every host that has one."""
        for name in sorted(self._faulted):
            host = self._hosts.get(name)
            if host is None:
                continue
            proc = subprocess.run(
                host.cmd(["nft", "delete", "table", "inet", TABLE]),
                capture_output=True,
                text=True,
                timeout=15,
                check=False,
            )
            if proc.returncode != 0 and "No such file" not in proc.stderr:
                raise RuntimeError(f"heal {name}: {proc.stderr.strip()}")
        if self._faulted:
            self._log("fault: heal")
        self._faulted.clear()
        self.faults.clear()
