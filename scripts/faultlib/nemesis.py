"""The nemeses of the fault harness: the faults one cell of backend x nemesis injects, and
the registry NEMESES (name -> class).

A nemesis is made with `NEMESES[name](dlock=PATH)`; `applies_to(deployment)` says whether it
means anything for that deployment (and fixes `pause_s` for the deployment's TTL), and
`run(ctx)` injects its fault for at most the phase's fault window, always heals it (finally),
and returns. ctx is what scripts/faults builds (see /work/notes/faults-api-changes.md):
topology, deployment, clients, duration, ttl_s, deadline, holders(), holder_info(),
workload, out_dir, backend, nemesis, log().

Every step is one line of <out>/nemesis.jsonl: {backend, nemesis, event, at_ns, detail}
(at_ns on CLOCK_BOOTTIME, the harness's one clock). Events: "start", "fault" (what was done,
to whom), per-nemesis steps ("flap-isolate", "flap-heal", "step"), "no-target" (nothing to
act on: no holder appeared in time; then nothing was injected), "healed" (every fault undone;
the checker measures unavailability from the last one), "heal-failed" (with the error; the
exception is raised after logging).

What cannot be shown here: tc netem is not available on this kernel, so no nemesis delays
packets; `loss` drops them at random (nftables numgen) instead. Clock nemeses move only the
wall clock of dlock processes started with the skew shim (skew.c, LD_PRELOAD), which needs a
dynamically linked dlock; server clocks are never moved.
"""

import json
import os
import shutil
import signal
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# How long a holder-targeting nemesis waits for some run to be inside its CS.
HOLDER_WAIT_S = 10.0
# How long target_node() waits for the servers to agree on a leader.
LEADER_WAIT_S = 10.0
# Slack kept before ctx.deadline for healing (restarts take seconds).
HEAL_SLACK_S = 20.0


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def default_dlock() -> str:
    """target/release/dlock if built, else target/debug/dlock (relative to the repo root)."""
    release = os.path.join(REPO, "target", "release", "dlock")
    return release if os.path.exists(release) else os.path.join(REPO, "target", "debug", "dlock")


def elf_interpreter(path: str) -> str | None:
    """The program interpreter (PT_INTERP) of an ELF executable: None for a static binary or
    anything that is not a readable 64/32-bit little-endian ELF file."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[5] != 1:
                return None
            is64 = head[4] == 2
            if is64:
                phoff = int.from_bytes(head[32:40], "little")
                phentsize = int.from_bytes(head[54:56], "little")
                phnum = int.from_bytes(head[56:58], "little")
            else:
                phoff = int.from_bytes(head[28:32], "little")
                phentsize = int.from_bytes(head[42:44], "little")
                phnum = int.from_bytes(head[44:46], "little")
            for i in range(min(phnum, 256)):
                f.seek(phoff + i * phentsize)
                ph = f.read(phentsize)
                if len(ph) < 32 or int.from_bytes(ph[0:4], "little") != 3:  # PT_INTERP
                    continue
                if is64:
                    offset = int.from_bytes(ph[8:16], "little")
                    size = int.from_bytes(ph[32:40], "little")
                else:
                    offset = int.from_bytes(ph[4:8], "little")
                    size = int.from_bytes(ph[16:20], "little")
                f.seek(offset)
                return f.read(min(size, 4096)).rstrip(b"\0").decode(errors="replace")
    except OSError:
        return None
    return None


def compile_skew(out_dir: str) -> str:
    """skew.c compiled into <out_dir>/skew.so (again only when skew.c is newer)."""
    source = os.path.join(HERE, "skew.c")
    target = os.path.join(out_dir, "skew.so")
    if os.path.exists(target) and os.path.getmtime(target) >= os.path.getmtime(source):
        return target
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{target}.{os.getpid()}.tmp"
    build = subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-o", tmp, source, "-ldl", "-lpthread"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if build.returncode != 0:
        raise RuntimeError(f"compiling skew.c failed: {build.stderr.strip()[-2000:]}")
    os.replace(tmp, target)
    return target


def write_skew(path: str, seconds: float):
    """Set the wall-clock skew the shim reads from path (atomically: a new file renamed over
    the old one, which the shim notices by its inode)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{seconds:g}\n")
    os.replace(tmp, path)


def clear_skew(path: str):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def ttl_seconds(text: str) -> float:
    """'3s', '500ms', '1m', '2' (seconds) -> seconds."""
    text = text.strip()
    for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)


def _is_dlock(pid: int) -> bool:
    """Whether pid is (still) a live `dlock run` (a program named dlock*, not a zombie), so a
    pid reused by something else is never signalled."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    if stat[stat.rfind(")") + 2 :].split()[:1] == ["Z"]:
        return False
    return os.path.basename(argv[0]).startswith(b"dlock") and b"run" in argv[1:]


def _signal_group(pid: int, sig) -> bool:
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


class Nemesis:
    """Base class: run() logs start, calls inject(ctx) inside try/finally with heal(ctx), and
    logs healed. Subclasses set name, describe, and implement inject (and heal when the fault
    is not a network one)."""

    name = ""
    describe = ""
    # Seconds a pause nemesis stops its target (None for the others); fixed by applies_to().
    pause_s: float | None = None
    # "holder" or "leader" for pause nemeses: whose pause pause_s is.
    pause_target: str | None = None

    def __init__(self, dlock: str | None = None):
        self.dlock = dlock or default_dlock()
        self.ttl_s = 3.0
        self._ctx = None
        self.events: list[dict] = []

    def __repr__(self):
        return f"Nemesis({self.name})"

    # --- what the harness calls --------------------------------------------------------

    def applies_to(self, deployment) -> bool:
        self.ttl_s = ttl_seconds(getattr(deployment, "ttl", "3s"))
        self._configure()
        return self._applies(deployment)

    def client_env(self, out_dir: str) -> dict[str, str]:
        """Environment every dlock run of the phase gets (the clock nemeses' LD_PRELOAD)."""
        return {}

    def run(self, ctx):
        self._ctx = ctx
        self.ttl_s = float(getattr(ctx, "ttl_s", self.ttl_s) or self.ttl_s)
        self._configure()
        self.log("start", self.describe)
        healed = False
        try:
            self.inject(ctx)
        finally:
            try:
                self.heal(ctx)
                healed = True
            except Exception as e:
                self.log("heal-failed", f"{type(e).__name__}: {e}")
                raise
            finally:
                if healed:
                    self.log("healed", "every fault of this nemesis undone")

    # --- for subclasses ----------------------------------------------------------------

    def _configure(self):
        """Derive TTL-dependent parameters (pause_s) from self.ttl_s."""

    def _applies(self, deployment) -> bool:
        return True

    def inject(self, ctx):
        raise NotImplementedError

    def heal(self, ctx):
        ctx.topology.heal()

    def log(self, event: str, detail: str = "", **fields):
        ctx = self._ctx
        line = {
            "backend": getattr(ctx, "backend", None) or getattr(getattr(ctx, "deployment", None), "backend", None),
            "nemesis": getattr(ctx, "nemesis", None) or self.name,
            "event": event,
            "at_ns": now_ns(),
            "detail": detail,
            **fields,
        }
        self.events.append(line)
        out_dir = getattr(ctx, "out_dir", None)
        if out_dir:
            with open(os.path.join(out_dir, "nemesis.jsonl"), "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
        say = getattr(ctx, "log", None)
        if say:
            say(f"nemesis {self.name}: {event}{': ' + detail if detail else ''}")

    def window_s(self, ctx, wanted: float | None = None) -> float:
        """How long the fault may last: wanted (default the phase's fault window), cut so that
        healing still ends before ctx.deadline."""
        wanted = float(ctx.duration) if wanted is None else wanted
        deadline = getattr(ctx, "deadline", None)
        if deadline:
            left = (deadline - now_ns()) / 1e9 - HEAL_SLACK_S
            wanted = min(wanted, max(0.0, left))
        return max(0.0, wanted)

    @staticmethod
    def hold(seconds: float):
        """Keep the fault in place for seconds (a fault's length, not a synchronisation)."""
        end = time.monotonic() + seconds
        for _ in range(100000):
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.5))

    def target_node(self, ctx) -> str | None:
        """The leader (master) of the first lock name the workload uses, waiting up to
        LEADER_WAIT_S for the nodes to agree on one (a previous fault may have left an election
        running); else the first data node."""
        d = ctx.deployment
        names = list(getattr(getattr(ctx, "workload", None), "names", None) or [])
        end = time.monotonic() + LEADER_WAIT_S
        for _ in range(1000):
            leader = d.leader(names[0]) if names else d.leader()
            if leader or not d.supports("leader") or time.monotonic() > end:
                break
            time.sleep(0.2)
        if leader:
            return leader
        nodes = d.data_nodes() if hasattr(d, "data_nodes") else d.nodes()
        return nodes[0] if nodes else None

    def wait_holder(self, ctx, seconds: float = HOLDER_WAIT_S) -> dict | None:
        """The newest run inside its CS (its whole CS is still ahead), waiting up to seconds
        for one; None (logged as no-target) when none appears."""
        end = time.monotonic() + min(seconds, max(1.0, float(ctx.duration)))
        for _ in range(100000):
            infos = [i for i in ctx.holder_info() if _is_dlock(int(i.get("dlock_pid", 0) or 0))]
            if infos:
                return infos[-1]
            if time.monotonic() > end:
                break
            time.sleep(0.02)
        self.log("no-target", f"no run was inside its critical section within {seconds:g}s: nothing injected")
        return None


# --- network -----------------------------------------------------------------------------


class _Network(Nemesis):
    def _applies(self, deployment) -> bool:
        return deployment.supports("network") and bool(deployment.server_hosts())


class IsolateNode(_Network):
    name = "isolate-node"
    describe = "the leader's (or only) server host cut off from every other host, both ways"

    def inject(self, ctx):
        node = self.target_node(ctx)
        host = ctx.deployment.host_of(node)
        seconds = self.window_s(ctx)
        ctx.topology.isolate(host)
        self.log("fault", f"isolated {node} ({host.addr}) for {seconds:.1f}s", node=node)
        self.hold(seconds)


class Split(_Network):
    name = "split"
    describe = "majority/minority partition: the leader and half the client hosts on the minority side"

    def _applies(self, deployment) -> bool:
        return super()._applies(deployment) and len(deployment.server_hosts()) >= 3

    def inject(self, ctx):
        d = ctx.deployment
        nodes = d.nodes()
        leader = self.target_node(ctx)
        # Each kind of node is split on its own (Sentinel: Redis servers and sentinels), so
        # the leader and a minority of every kind end up on the small side.
        data = d.data_nodes() if hasattr(d, "data_nodes") else nodes
        others = [n for n in nodes if n not in data]
        minority = [leader] + [n for n in data if n != leader][: max(0, (len(data) - 1) // 2 - 1)]
        minority += others[: (len(others) - 1) // 2] if others else []
        majority = [n for n in nodes if n not in minority]
        clients = list(ctx.clients)
        minority_clients = clients[: len(clients) // 2]
        majority_clients = clients[len(clients) // 2 :]
        side_a = [d.host_of(n) for n in minority] + minority_clients
        side_b = [d.host_of(n) for n in majority] + majority_clients
        seconds = self.window_s(ctx)
        ctx.topology.partition(side_a, side_b)
        self.log(
            "fault",
            f"partitioned {{{' '.join(h.name for h in side_a)}}} from {{{' '.join(h.name for h in side_b)}}} for {seconds:.1f}s",
            minority=[h.name for h in side_a],
            majority=[h.name for h in side_b],
        )
        self.hold(seconds)


class IsolateHolder(_Network):
    name = "isolate-holder"
    describe = "the client host of a run inside its CS cut off from every server host (the fencing resource stays reachable)"

    def inject(self, ctx):
        info = self.wait_holder(ctx)
        if info is None:
            return
        host = ctx.topology.host(info["host"])
        seconds = self.window_s(ctx)
        ctx.topology.partition([host], ctx.deployment.server_hosts())
        self.log(
            "fault",
            f"cut client host {host.name} (holder dlock {info['dlock_pid']} of {info['name']}) from the servers for {seconds:.1f}s",
            host=host.name,
            dlock_pid=info["dlock_pid"],
            name=info["name"],
        )
        self.hold(seconds)


class OneWay(_Network):
    name = "one-way"
    describe = "packets from every server host to the holder's client host dropped; the holder's packets still arrive"

    def inject(self, ctx):
        info = self.wait_holder(ctx)
        if info is None:
            return
        host = ctx.topology.host(info["host"])
        seconds = self.window_s(ctx)
        for server in ctx.deployment.server_hosts():
            ctx.topology.drop_one_way(server, host)
        self.log(
            "fault",
            f"dropped servers -> {host.name} (holder dlock {info['dlock_pid']} of {info['name']}) for {seconds:.1f}s",
            host=host.name,
            dlock_pid=info["dlock_pid"],
            name=info["name"],
        )
        self.hold(seconds)


class Flapping(_Network):
    name = "flapping"
    describe = "the leader's (or only) server host isolated and healed in turn, about every second"
    PERIOD_S = 1.0

    def inject(self, ctx):
        node = self.target_node(ctx)
        host = ctx.deployment.host_of(node)
        seconds = self.window_s(ctx)
        end = time.monotonic() + seconds
        flaps = 0
        self.log("fault", f"flapping {node} ({host.addr}) every {self.PERIOD_S:g}s for {seconds:.1f}s", node=node)
        for _ in range(int(seconds / self.PERIOD_S) + 2):
            if time.monotonic() >= end:
                break
            ctx.topology.isolate(host)
            flaps += 1
            self.log("flap-isolate", f"{node} isolated ({flaps})")
            self.hold(min(self.PERIOD_S, max(0.0, end - time.monotonic())))
            ctx.topology.heal()
            self.log("flap-heal", f"{node} reachable ({flaps})")
            self.hold(min(self.PERIOD_S, max(0.0, end - time.monotonic())))


class Loss(_Network):
    name = "loss"
    describe = "30% of the leader's (or only) server host's packets dropped at random, both ways (no delay: no netem here)"
    PERCENT = 30

    def inject(self, ctx):
        node = self.target_node(ctx)
        host = ctx.deployment.host_of(node)
        seconds = self.window_s(ctx)
        ctx.topology.loss(host, self.PERCENT)
        self.log("fault", f"{self.PERCENT}% loss on {node} ({host.addr}) for {seconds:.1f}s", node=node)
        self.hold(seconds)


# --- pauses --------------------------------------------------------------------------------


class _Pause(Nemesis):
    """A SIGSTOP for FACTOR x TTL + PLUS_S seconds (pause_s, which the checker reads)."""

    FACTOR = 1.0
    PLUS_S = 0.0

    def _configure(self):
        self.pause_s = round(self.ttl_s * self.FACTOR + self.PLUS_S, 3)


class _PauseLeader(_Pause):
    pause_target = "leader"

    def _applies(self, deployment) -> bool:
        return deployment.supports("pause") and bool(deployment.nodes())

    def inject(self, ctx):
        self._paused = None
        node = self.target_node(ctx)
        seconds = self.window_s(ctx, self.pause_s)
        ctx.deployment.pause(node)
        self._paused = node
        self.log("fault", f"SIGSTOP {node}'s server for {seconds:.2f}s (TTL {self.ttl_s:g}s)", node=node, pause_s=seconds)
        self.hold(seconds)

    def heal(self, ctx):
        node = getattr(self, "_paused", None)
        if node is not None:
            ctx.deployment.resume(node)
            self._paused = None


class PauseLeaderShort(_PauseLeader):
    name = "pause-leader-short"
    describe = "the leader's (or only) server stopped for 0.3 x TTL"
    FACTOR = 0.3


class PauseLeaderLong(_PauseLeader):
    name = "pause-leader-long"
    describe = "the leader's (or only) server stopped for 2 x TTL + 1 s"
    FACTOR = 2.0
    PLUS_S = 1.0


class _PauseHolder(_Pause):
    pause_target = "holder"

    def inject(self, ctx):
        self._paused = None
        info = self.wait_holder(ctx)
        if info is None:
            return
        pid = int(info["dlock_pid"])
        seconds = self.window_s(ctx, self.pause_s)
        # dlock leads its own process group; its command runs in another one and goes on.
        if not (_is_dlock(pid) and _signal_group(pid, signal.SIGSTOP)):
            self.log("no-target", f"holder dlock {pid} ended before it could be stopped: nothing injected")
            return
        self._paused = pid
        self.log(
            "fault",
            f"SIGSTOP holder dlock {pid} ({info['host']}, {info['name']}) for {seconds:.2f}s (TTL {self.ttl_s:g}s)",
            dlock_pid=pid,
            host=info["host"],
            name=info["name"],
            pause_s=seconds,
        )
        self.hold(seconds)

    def heal(self, ctx):
        pid = getattr(self, "_paused", None)
        if pid is not None:
            _signal_group(pid, signal.SIGCONT)
            self._paused = None


class PauseHolderShort(_PauseHolder):
    name = "pause-holder-short"
    # Shorter than the TTL, so no lease expires; but a pause that straddles a renewal can
    # still take dlock past its deadline minus --kill-after (for TTL 3 s, --kill-after 1 s:
    # about 0.5 s), and then it stops its command (124) on waking: allowed, never an overlap.
    describe = "a holding dlock stopped (SIGSTOP) for 0.3 x TTL: no lease expires; it may stop its command (124) on waking"
    FACTOR = 0.3


class PauseHolderLong(_PauseHolder):
    name = "pause-holder-long"
    describe = "a holding dlock stopped (SIGSTOP) for 2 x TTL + 1 s: its lease expires, its command runs on"
    FACTOR = 2.0
    PLUS_S = 1.0


# --- crashes -------------------------------------------------------------------------------


class _Crash(Nemesis):
    WIPE = False

    def _down_s(self, ctx) -> float:
        # Long enough for every lease the crashed server gave to have expired.
        return self.window_s(ctx, min(float(ctx.duration), 2 * self.ttl_s))

    def inject(self, ctx):
        self._crashed = None
        node = self.target_node(ctx)
        seconds = self._down_s(ctx)
        ctx.deployment.crash(node)
        self._crashed = node
        self.log("fault", f"SIGKILL {node}'s server; restart{' without its data' if self.WIPE else ''} after {seconds:.1f}s", node=node)
        self.hold(seconds)

    def heal(self, ctx):
        node = getattr(self, "_crashed", None)
        if node is None:
            return
        t0 = time.monotonic()
        ctx.deployment.restart(node, wipe=self.WIPE)
        self._crashed = None
        self.log("restarted", f"{node} serving again{' (wiped)' if self.WIPE else ''} after {time.monotonic() - t0:.1f}s of start-up", node=node)


class CrashLeader(_Crash):
    name = "crash-leader"
    describe = "the leader's (or only) server SIGKILLed, restarted with its data after 2 x TTL"

    def _applies(self, deployment) -> bool:
        return deployment.supports("crash") and bool(deployment.nodes())


class CrashWipe(_Crash):
    name = "crash-wipe"
    describe = "the leader's (or only) server SIGKILLed, restarted without its data (where that is a real mode)"
    WIPE = True

    def _applies(self, deployment) -> bool:
        return deployment.supports("restart-wipe") and bool(deployment.nodes())


class CrashHolder(Nemesis):
    name = "crash-holder"
    describe = "a holding dlock SIGKILLed (its command dies with it: PR_SET_PDEATHSIG)"

    def inject(self, ctx):
        info = self.wait_holder(ctx)
        if info is None:
            return
        pid = int(info["dlock_pid"])
        if not _is_dlock(pid):
            self.log("no-target", f"holder dlock {pid} ended before it could be killed: nothing injected")
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            self.log("no-target", f"holder dlock {pid} ended before it could be killed: nothing injected")
            return
        self.log("fault", f"SIGKILL holder dlock {pid} ({info['host']}, {info['name']})", dlock_pid=pid, host=info["host"], name=info["name"])

    def heal(self, ctx):
        """Nothing to undo: the next runs are the recovery."""


# --- clocks --------------------------------------------------------------------------------


class _Clock(Nemesis):
    def _applies(self, deployment) -> bool:
        return elf_interpreter(self.dlock) is not None and bool(shutil.which("gcc"))

    def client_env(self, out_dir: str) -> dict[str, str]:
        return {"LD_PRELOAD": compile_skew(out_dir)}

    def heal(self, ctx):
        for path in getattr(self, "_skewed", []):
            clear_skew(path)
        self._skewed = []


class ClockSkew(_Clock):
    name = "clock-skew"
    describe = "a holder's wall clock 5 min behind and a waiter's 5 min ahead (dlock processes only, via the skew shim)"
    HOLDER_S = -300.0
    WAITER_S = 300.0

    def inject(self, ctx):
        self._skewed = []
        info = self.wait_holder(ctx)
        if info is None:
            return
        holder_file = info["skew_file"]
        waiters = [f for f in ctx.workload.waiter_skew_files() if f != holder_file]
        # A waiter on another client host when there is one.
        other = [f for f in waiters if not os.path.basename(f).startswith(f"{info['host']}-")]
        waiter_file = (other or waiters or [None])[0]
        seconds = self.window_s(ctx)
        write_skew(holder_file, self.HOLDER_S)
        self._skewed.append(holder_file)
        if waiter_file:
            write_skew(waiter_file, self.WAITER_S)
            self._skewed.append(waiter_file)
        self.log(
            "fault",
            f"wall clock {self.HOLDER_S:+g}s for client {os.path.basename(holder_file)} (holder dlock {info['dlock_pid']} of {info['name']})"
            + (f", {self.WAITER_S:+g}s for client {os.path.basename(waiter_file)}" if waiter_file else ", no waiter to skew")
            + f", for {seconds:.1f}s",
            skews={os.path.basename(p): s for p, s in zip(self._skewed, (self.HOLDER_S, self.WAITER_S))},
        )
        self.hold(seconds)


class ClockStep(_Clock):
    name = "clock-step"
    describe = "a holder's wall clock stepped forward and back by 10 min, about every second, while it holds"
    STEP_S = 600.0
    PERIOD_S = 1.0

    def inject(self, ctx):
        self._skewed = []
        info = self.wait_holder(ctx)
        if info is None:
            return
        path = info["skew_file"]
        self._skewed.append(path)
        seconds = self.window_s(ctx)
        end = time.monotonic() + seconds
        self.log(
            "fault",
            f"stepping the wall clock of client {os.path.basename(path)} (holder dlock {info['dlock_pid']} of {info['name']}) "
            f"by +-{self.STEP_S:g}s every {self.PERIOD_S:g}s for {seconds:.1f}s",
        )
        sequence = (self.STEP_S, -self.STEP_S, 0.0)
        for i in range(int(seconds / self.PERIOD_S) + 2):
            if time.monotonic() >= end:
                break
            skew = sequence[i % len(sequence)]
            write_skew(path, skew)
            self.log("step", f"client {os.path.basename(path)} wall clock {skew:+g}s")
            self.hold(min(self.PERIOD_S, max(0.0, end - time.monotonic())))


# --- baseline ------------------------------------------------------------------------------


class NoFault(Nemesis):
    name = "none"
    describe = "no fault: the baseline"

    def inject(self, ctx):
        self.hold(self.window_s(ctx))

    def heal(self, ctx):
        """Nothing to undo."""


NEMESES: dict[str, type[Nemesis]] = {
    cls.name: cls
    for cls in (
        NoFault,
        IsolateNode,
        Split,
        IsolateHolder,
        OneWay,
        Flapping,
        Loss,
        PauseLeaderShort,
        PauseLeaderLong,
        PauseHolderShort,
        PauseHolderLong,
        CrashLeader,
        CrashWipe,
        CrashHolder,
        ClockSkew,
        ClockStep,
    )
}
