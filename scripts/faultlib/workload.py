"""The workload of scripts/faults: client loops running `dlock run` on a few names, the
critical-section program they run, and the history they write.

Clients: K per client host (threads of the harness, each running one `dlock run` at a time
inside its host's namespace), each looping on one of the names for the phase (client i of
all hosts on name i mod N, so each name is contended across hosts). Each run is
`dlock run --url URL --ttl TTL --wait W --kill-after KA NAME -- cs …` (cs.c, compiled once into
the out dir): the critical section stamps its entry and exit on CLOCK_BOOTTIME, accesses the
fencing resource with its token on entry and on exit, and sleeps (short, or every few runs
longer than the TTL, so that faults meet holders whose lease must be renewed).

Each run is bounded: a run that has not ended after W + TTL + KA + the long CS + HUNG_SLACK_S
(+ the nemesis's declared pause for pause nemeses) is SIGKILLed and recorded as hung.

History (history.jsonl, one line per run; the documented fields first):
  backend, nemesis, name, host, pid (dlock's), token, enter_ns, exit_ns (CLOCK_BOOTTIME; null
  when the run never entered its CS), rc (the run's exit status; 128+N for a signal),
  mode ("exclusive"),
and: client, run, start_ns/end_ns (dlock started/exited), exit_by ("normal": the CS ended
itself, "term": SIGTERM from dlock, "dlock-exit": no stamp, the CS was SIGKILLed; its end is
bounded by dlock's exit), fence_enter/fence_exit ("ok …", "stale …", "error …"), hung,
cancelled (stopped by the harness at the end of the phase before entering), cs_ms.

While a CS runs, <out>/inside/<dlock pid> holds one JSON line describing it (holders()).
"""

import json
import os
import signal
import subprocess
import threading
import time

HUNG_SLACK_S = 10.0
# A run that did not get the lock waits this long before the next one, so that a server that
# refuses at once does not make the client spin.
RETRY_PAUSE_S = 0.1
MAX_RUNS_PER_CLIENT = 100_000


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def duration_s(text: str) -> float:
    """'3s', '500ms', '2m', '1.5s', or a bare number of seconds."""
    t = str(text).strip()
    for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if t.endswith(suffix):
            return float(t[: -len(suffix)]) * scale
    return float(t)


def ms_arg(seconds: float) -> str:
    return f"{int(round(seconds * 1000))}ms"


def compile_cs(out_dir: str) -> str:
    """gcc cs.c into <out>/cs; returns its path. Raises RuntimeError with gcc's message."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cs.c")
    exe = os.path.join(out_dir, "cs")
    proc = subprocess.run(["gcc", "-O2", "-Wall", "-o", exe, src], capture_output=True,
                          text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"gcc cs.c: {proc.stderr.strip()}")
    return exe


def parse_run_file(path: str) -> dict:
    """The stamps cs wrote: enter_ns, token, cs_pid, fence_enter, fence_exit, exit_ns, exit_by."""
    out = {"enter_ns": None, "token": None, "cs_pid": None, "fence_enter": None,
           "fence_exit": None, "exit_ns": None, "exit_by": None}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if not parts:
            continue
        try:
            if parts[0] == "enter" and len(parts) >= 4 and out["enter_ns"] is None:
                out["enter_ns"] = int(parts[1])
                out["token"] = int(parts[2]) if parts[2] != "-1" else None
                out["cs_pid"] = int(parts[3])
            elif parts[0] == "fence" and len(parts) >= 3:
                out[f"fence_{parts[1]}"] = " ".join(parts[2:-1])
            elif parts[0] == "exit" and len(parts) >= 3 and out["exit_ns"] is None:
                out["exit_ns"] = int(parts[1])
                out["exit_by"] = parts[2]
        except ValueError:
            continue
    return out


class Workload:
    """One phase's clients. start(), holders(), stop(); history lines go to
    <out>/history.jsonl (appended; the file is shared by every phase of the harness)."""

    def __init__(self, topology, deployment, out_dir: str, nemesis_name: str, *,
                 clients, fence_addr: str, fence_port: int, dlock: str, cs: str,
                 names=("n0", "n1"), clients_per_host: int = 2, wait_s: float = 5.0,
                 kill_after_s: float = 1.0, cs_ms: int = 50, long_cs_ms: int | None = None,
                 long_every: int = 5, fence_timeout_ms: int = 1000,
                 extra_env: dict | None = None, hung_extra_s: float = 0.0, log=print):
        self.topology = topology
        self.deployment = deployment
        self.backend = deployment.backend
        self.out_dir = out_dir
        self.nemesis = nemesis_name
        self.clients = list(clients)
        self.fence_addr = fence_addr
        self.fence_port = fence_port
        self.dlock = dlock
        self.cs = cs
        self.names = list(names)
        self.k = clients_per_host
        self.ttl = deployment.ttl
        self.ttl_s = duration_s(deployment.ttl)
        self.wait_s = wait_s
        self.kill_after_s = kill_after_s
        self.cs_ms = cs_ms
        self.long_cs_ms = long_cs_ms if long_cs_ms is not None else int(self.ttl_s * 1000 + 1000)
        self.long_every = long_every
        self.fence_timeout_ms = fence_timeout_ms
        self.extra_env = dict(extra_env or {})
        self.log = log
        # The bound on one run: every run ends within its --wait plus this.
        self.hung_bound_s = (wait_s + self.ttl_s + kill_after_s + self.long_cs_ms / 1000.0
                             + 2 * fence_timeout_ms / 1000.0 + HUNG_SLACK_S + hung_extra_s)
        self.inside_dir = os.path.join(out_dir, "inside")
        self.runs_dir = os.path.join(out_dir, "runs", f"{self.backend}.{nemesis_name}")
        self.skew_dir = os.path.join(out_dir, "skew")
        self.logs_dir = os.path.join(out_dir, "logs", "clients")
        for d in (self.inside_dir, self.runs_dir, self.skew_dir, self.logs_dir):
            os.makedirs(d, exist_ok=True)
        self._history = open(os.path.join(out_dir, "history.jsonl"), "a", encoding="utf-8")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._current: dict[str, tuple[int, str]] = {}  # client -> (dlock pid, run file)
        self._cancelled: set[int] = set()  # dlock pids the harness stopped while waiting
        self.runs = 0
        self.entered = 0
        self.started_ns: int | None = None
        self.stopped_ns: int | None = None

    # --- what nemeses use --------------------------------------------------------------

    def holder_info(self) -> list[dict]:
        """The runs inside their CS now (the inside files)."""
        out = []
        try:
            entries = os.listdir(self.inside_dir)
        except OSError:
            return out
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(os.path.join(self.inside_dir, entry), encoding="utf-8") as f:
                    info = json.loads(f.read())
            except (OSError, ValueError):
                continue
            out.append(info)
        out.sort(key=lambda i: i.get("enter_ns", 0))
        return out

    def holders(self) -> list[tuple]:
        """(Host, dlock pid, name) of each run inside its CS now, oldest entry first."""
        out = []
        for info in self.holder_info():
            try:
                host = self.topology.host(info["host"])
            except KeyError:
                continue
            out.append((host, int(info["dlock_pid"]), info["name"]))
        return out

    def skew_file(self, host_name: str, client) -> str:
        """The SKEW_FILE of a client (client: its index, or a dlock pid of a current run)."""
        if isinstance(client, int) and client >= self.k:
            for info in self.holder_info():
                if info.get("dlock_pid") == client:
                    return info["skew_file"]
            for cname, (pid, _run) in list(self._current.items()):
                if pid == client:
                    return os.path.join(self.skew_dir, cname)
            raise KeyError(f"no run with dlock pid {client}")
        return os.path.join(self.skew_dir, f"{host_name}-{client}")

    def skew_files(self) -> list[str]:
        return [os.path.join(self.skew_dir, f"{h.name}-{k}") for h in self.clients
                for k in range(self.k)]

    def waiter_skew_files(self) -> list[str]:
        holding = {i.get("skew_file") for i in self.holder_info()}
        return [f for f in self.skew_files() if f not in holding]

    # --- running -----------------------------------------------------------------------

    def _env(self, host, k: int) -> dict:
        env = {key: value for key, value in os.environ.items() if not key.startswith("DLOCK_")}
        queue_dir = os.path.join(self.out_dir, "hosts", host.name)
        os.makedirs(queue_dir, mode=0o700, exist_ok=True)
        env["DLOCK_DIR"] = queue_dir
        env.update({k2: str(v) for k2, v in getattr(self.deployment, "extra_env", {}).items()})
        env.update(self.extra_env)
        env["SKEW_FILE"] = os.path.join(self.skew_dir, f"{host.name}-{k}")
        return env

    def start(self):
        self.started_ns = now_ns()
        for host in self.clients:
            for k in range(self.k):
                t = threading.Thread(target=self._loop, args=(host, k), daemon=True,
                                     name=f"client-{host.name}-{k}")
                self._threads.append(t)
                t.start()

    def _loop(self, host, k: int):
        client = f"{host.name}-{k}"
        env = self._env(host, k)
        url = self.deployment.url()
        log_path = os.path.join(self.logs_dir, f"{self.backend}.{self.nemesis}.{client}.log")
        index = self.clients.index(host) * self.k + k
        with open(log_path, "ab") as log:
            for seq in range(MAX_RUNS_PER_CLIENT):
                if self._stop.is_set():
                    return
                # Each client keeps one name: every name is always wanted, by clients of
                # different hosts (c1-0 and c2-0 share n0).
                name = self.names[index % len(self.names)]
                long_run = self.long_every > 0 and (seq + index) % self.long_every == self.long_every - 1
                entered = self._one_run(host, k, client, seq, name, url, env, log,
                                        self.long_cs_ms if long_run else self.cs_ms)
                if not entered:
                    self._stop.wait(RETRY_PAUSE_S)

    def _one_run(self, host, k, client, seq, name, url, env, log, sleep_ms) -> bool:
        run_id = f"{client}-{seq}"
        run_file = os.path.join(self.runs_dir, run_id)
        argv = [
            self.dlock, "run", "--url", url, "--ttl", self.ttl, "--wait", ms_arg(self.wait_s),
            "--kill-after", ms_arg(self.kill_after_s), name, "--",
            self.cs, run_file, self.inside_dir, self.fence_addr, str(self.fence_port),
            self.backend, self.nemesis, name, host.name, client, str(sleep_ms),
            str(self.fence_timeout_ms), env["SKEW_FILE"], run_id,
        ]
        log.write(f"== {run_id} {name} {now_ns()}\n".encode())
        log.flush()
        start = now_ns()
        try:
            popen = subprocess.Popen(host.cmd(argv), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=log, env=env,
                                     start_new_session=True)
        except OSError as e:
            log.write(f"== {run_id} could not start: {e}\n".encode())
            return False
        with self._lock:
            self._current[client] = (popen.pid, run_file)
        hung = False
        try:
            rc = popen.wait(timeout=self.hung_bound_s)
        except subprocess.TimeoutExpired:
            hung = True
            self._killpg(popen.pid, signal.SIGKILL)
            try:
                rc = popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                rc = None
        end = now_ns()
        with self._lock:
            self._current.pop(client, None)
            cancelled = popen.pid in self._cancelled_pids()
        if rc is not None and rc < 0:
            rc = 128 - rc
        stamps = parse_run_file(run_file)
        self._remove_inside(popen.pid, run_id)
        exit_ns, exit_by = stamps["exit_ns"], stamps["exit_by"]
        if stamps["enter_ns"] is not None and exit_ns is None:
            exit_ns, exit_by = end, "dlock-exit"
        line = {
            "backend": self.backend, "nemesis": self.nemesis, "name": name, "host": host.name,
            "pid": popen.pid, "token": stamps["token"], "enter_ns": stamps["enter_ns"],
            "exit_ns": exit_ns, "rc": rc, "mode": "exclusive",
            "client": client, "run": run_id, "start_ns": start, "end_ns": end,
            "exit_by": exit_by, "fence_enter": stamps["fence_enter"],
            "fence_exit": stamps["fence_exit"], "hung": hung, "cancelled": cancelled,
            "cs_ms": sleep_ms,
        }
        with self._lock:
            if self._history.closed:
                return False
            self._history.write(json.dumps(line) + "\n")
            self._history.flush()
            self.runs += 1
            if stamps["enter_ns"] is not None:
                self.entered += 1
        try:
            os.unlink(run_file)
        except OSError:
            pass
        return stamps["enter_ns"] is not None

    def _cancelled_pids(self) -> set:
        return self._cancelled

    def _remove_inside(self, pid: int, run_id: str):
        """The inside file of a CS that could not remove it (SIGKILL), if it is this run's."""
        path = os.path.join(self.inside_dir, str(pid))
        try:
            with open(path, encoding="utf-8") as f:
                info = json.loads(f.read())
            if info.get("run") == run_id:
                os.unlink(path)
        except (OSError, ValueError):
            pass

    @staticmethod
    def _killpg(pid: int, sig):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout_s: float | None = None):
        """End the phase: no new runs; runs still waiting for the lock are cancelled (SIGTERM,
        recorded with cancelled: true), runs inside their CS finish. Bounded: after timeout_s
        (default: the hung bound + 5 s) the remaining runs are SIGKILLed by pid."""
        self._stop.set()
        with self._lock:
            current = list(self._current.values())
        for pid, run_file in current:
            if parse_run_file(run_file)["enter_ns"] is None:
                with self._lock:
                    self._cancelled.add(pid)
                self._killpg(pid, signal.SIGCONT)
                self._killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + (timeout_s if timeout_s is not None
                                       else self.hung_bound_s + 5.0)
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        left = [t for t in self._threads if t.is_alive()]
        if left:
            with self._lock:
                pids = [pid for pid, _ in self._current.values()]
            for pid in pids:
                self._killpg(pid, signal.SIGCONT)
                self._killpg(pid, signal.SIGKILL)
            for t in left:
                t.join(15.0)
        self.stopped_ns = now_ns()
        with self._lock:
            self._history.close()
        return [t.name for t in self._threads if t.is_alive()]
