"""Processes inside hosts: started with `ip netns exec` (which execs, so the pid we hold is the
program's own), each in its own session and process group so that pause, resume and kill reach
everything it forked; output to a log file; readiness waits with deadlines.

Every process started here is remembered until reaped; stop_all() (also run at interpreter
exit) stops those still running, by pid.
"""

import atexit
import os
import signal
import subprocess
import time

_live: dict[int, "Proc"] = {}


class Proc:
    """A process in a host, leading its own process group (pgid == pid)."""

    def __init__(self, popen: subprocess.Popen, name: str, host, log: str, argv: list[str]):
        self.popen = popen
        self.pid = popen.pid
        self.name = name
        self.host = host
        self.log = log
        self.argv = argv
        self.paused = False

    def __repr__(self):
        where = self.host.name if self.host is not None else "root"
        return f"Proc({self.name} pid={self.pid} on {where})"

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def _group(self, sig) -> bool:
        """Signal the process group; False when it no longer exists."""
        try:
            os.killpg(self.pid, sig)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return False

    def pause(self):
        """SIGSTOP to its process group."""
        if self.alive():
            self._group(signal.SIGSTOP)
            self.paused = True

    def resume(self):
        """SIGCONT to its process group."""
        self._group(signal.SIGCONT)
        self.paused = False

    def kill(self, sig=signal.SIGKILL, timeout: float = 10.0) -> bool:
        """Send sig to its process group, then reap: wait up to timeout for the process to end
        (for signals other than SIGKILL it may survive: then False). True when it ended."""
        if self.alive():
            self._group(sig)
            if sig == signal.SIGKILL:
                # A stopped process dies of SIGKILL as it is; nothing else of the group may
                # stay stopped either.
                self.paused = False
        return self._reap(timeout)

    def _reap(self, timeout: float) -> bool:
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        _live.pop(self.pid, None)
        # Anything the leader forked and left behind in its group goes with it.
        self._group(signal.SIGKILL)
        return True

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (and SIGCONT, so a paused group can act on it), wait up to timeout, then
        SIGKILL. Returns the exit status (negative: the signal), None if it could not be reaped."""
        if self.alive():
            self._group(signal.SIGTERM)
            self._group(signal.SIGCONT)
            self.paused = False
            if not self._reap(timeout):
                self.kill(signal.SIGKILL)
        else:
            self._reap(0)
        return self.popen.poll()

    def tail(self, lines: int = 20) -> str:
        """The end of its log (for error messages)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 8192))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def start(host, argv, name, log_dir, env=None, cwd=None) -> Proc:
    """Start argv inside host (None: the root namespace) as `name`, stdout and stderr appended
    to <log_dir>/<name>.log, stdin /dev/null. env: variables added to (or, with value None,
    removed from) this process's environment."""
    argv = [str(a) for a in argv]
    os.makedirs(log_dir, exist_ok=True)
    log = os.path.join(log_dir, f"{name}.log")
    full_env = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = str(value)
    command = host.cmd(argv) if host is not None else argv
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    proc = Proc(popen, name, host, log, argv)
    _live[proc.pid] = proc
    return proc


def stop_all(timeout: float = 5.0):
    """Stop every process started here that still runs (by pid)."""
    for proc in list(_live.values()):
        try:
            proc.stop(timeout)
        except Exception:  # keep stopping the others
            pass
        _live.pop(proc.pid, None)


atexit.register(stop_all)

_PROBE = r"""
import socket, sys, time
addr, port, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + limit
while True:
    try:
        socket.create_connection((addr, port), timeout=1).close()
        sys.exit(0)
    except OSError:
        if time.monotonic() > end:
            sys.exit(1)
        time.sleep(0.05)
"""


def wait_port(host, addr, port, deadline_s, proc: Proc | None = None) -> None:
    """Wait until a TCP connect from inside host (None: root namespace) to addr:port succeeds.
    deadline_s: seconds from now. Raises TimeoutError naming what; with proc, fails early
    (RuntimeError with its log's tail) if that process exits meanwhile."""
    end = time.monotonic() + deadline_s
    if host is None:
        argv = ["python3", "-c", _PROBE, addr, str(port)]
    else:
        argv = host.cmd(["python3", "-c", _PROBE, addr, str(port)])
    where = host.name if host is not None else "root"
    # One probe process polls; it is restarted in short slices so a dead proc is noticed.
    for _ in range(100000):
        left = end - time.monotonic()
        if left <= 0:
            break
        slice_s = min(left, 2.0)
        try:
            done = subprocess.run(argv + [str(slice_s)], capture_output=True, timeout=slice_s + 10)
        except subprocess.TimeoutExpired:
            continue
        if done.returncode == 0:
            return
        if proc is not None and not proc.alive():
            raise RuntimeError(
                f"{proc.name} exited ({proc.returncode}) before {addr}:{port} answered:\n{proc.tail()}"
            )
    raise TimeoutError(f"{addr}:{port} did not accept a connection from {where} within {deadline_s:g}s")


def wait_line(path, needle, deadline_s, proc: Proc | None = None) -> None:
    """Wait until the file at path contains needle (a substring). deadline_s: seconds from
    now. Raises TimeoutError naming what; with proc, fails early if that process exits."""
    end = time.monotonic() + deadline_s
    needle_b = needle.encode() if isinstance(needle, str) else needle
    for _ in range(1000000):
        try:
            with open(path, "rb") as f:
                if needle_b in f.read():
                    return
        except FileNotFoundError:
            pass
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.returncode}) before {needle!r} in {path}:\n{proc.tail()}")
        if time.monotonic() > end:
            break
        time.sleep(0.05)
    raise TimeoutError(f"{needle!r} not in {path} within {deadline_s:g}s")


def wait_until(what: str, check, deadline_s, interval: float = 0.1):
    """Poll check() until it returns a true value (returned), for at most deadline_s seconds;
    raises TimeoutError naming what."""
    end = time.monotonic() + deadline_s
    for _ in range(1000000):
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            break
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {deadline_s:g}s")


def connect_in(host, addr: str, port: int, payload: bytes, timeout: float = 2.0) -> bytes | None:
    """Send payload to addr:port from inside host and return everything the peer answers
    before closing (None if it could not connect). For 4-letter words, PING and the like."""
    script = r"""
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    c.sendall(sys.stdin.buffer.read())
    c.shutdown(socket.SHUT_WR)
    out = b""
    while True:
        b = c.recv(65536)
        if not b:
            break
        out += b
    sys.stdout.buffer.write(out)
except OSError:
    sys.exit(3)
"""
    argv = ["python3", "-c", script, addr, str(port), str(timeout)]
    command = host.cmd(argv) if host is not None else argv
    try:
        done = subprocess.run(command, input=payload, capture_output=True, timeout=timeout + 10)
    except subprocess.TimeoutExpired:
        return None
    return done.stdout if done.returncode == 0 else None

