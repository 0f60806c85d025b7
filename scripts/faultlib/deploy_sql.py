"""Deployments of the single-server backends: PostgreSQL (`postgres`, host pg1), MariaDB
(`mysql`, host my1), memcached (`memcached`, host mc1), and the file backend (`file`, no server).

Each server runs on a host of its own, listening on that host's address only, at the
backend's usual port; leader() is that one server (losing it means unavailability: no
failover). Crash and restart keep PostgreSQL's and MariaDB's data; memcached keeps nothing
across a restart, which is why only memcached supports "restart-wipe".

PostgreSQL refuses to run as root: initdb and the postmaster run as the `postgres` user
through `setpriv` (which execs, so the pid we hold is the postmaster's). Its backends each
lead a session of their own, so pause, resume and crash signal the postmaster and every
process it forked, not just its process group. The data directory lives under the
deployment's workdir when `postgres` may write there, else in a directory of its own under
/tmp (named dlf<run>-pg-*, removed by stop()).

The file backend's locks are files under <workdir>/file/locks: file locks are the kernel's,
so clients in any number of namespaces of this machine share them; it has no server host,
so network and server faults do not apply to it.
"""

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

from . import procs
from .deploy import Deployment, register

# Unix socket paths are limited to 107 bytes; keep well below.
SOCKET_PATH_MAX = 96


def _children(pid: int) -> list[int]:
    """Every live descendant of pid (by the ppid in /proc/<pid>/stat), children first."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields start after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            parent_of[int(entry)] = int(fields[1])
    found: list[int] = []
    frontier = [pid]
    for _ in range(64):  # depth bound
        nxt = [child for child, parent in parent_of.items() if parent in frontier and child not in found]
        if not nxt:
            break
        found.extend(nxt)
        frontier = nxt
    return found


def _signal_all(pids: list[int], sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    # A zombie has ended; it only waits to be reaped by its parent.
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


def _pg_bin(name: str) -> str:
    """The newest installed PostgreSQL's program `name`."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda d: int(os.path.basename(os.path.dirname(d))) if os.path.basename(os.path.dirname(d)).isdigit() else 0,
    )
    for d in reversed(found):
        path = os.path.join(d, name)
        if os.path.exists(path):
            return path
    which = shutil.which(name)
    if which:
        return which
    raise FileNotFoundError(f"PostgreSQL's {name} is not installed (no /usr/lib/postgresql/*/bin/{name}): apt-get install -y postgresql")


def _binary(name: str, package: str) -> str:
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None)
    if not path:
        raise FileNotFoundError(f"{name} is not installed: apt-get install -y {package}")
    return path


class _SingleServer(Deployment):
    """One server host named NODES[0]; its server is the leader."""

    FAULTS = frozenset({"network", "pause", "crash", "leader"})

    def __init__(self, topo, workdir):
        super().__init__(topo, workdir)
        # Directories made outside the workdir (short socket paths, postgres-writable data).
        self._outside: list[str] = []

    @property
    def node(self) -> str:
        return self.NODES[0]

    def addr(self) -> str:
        return self.host_of(self.node).addr

    def leader(self, name: str | None = None) -> str | None:
        return self.node

    def _outside_dir(self, what: str) -> str:
        path = tempfile.mkdtemp(prefix=f"dlf{self.topo.run}-{what}-", dir="/tmp")
        self._outside.append(path)
        return path

    def _short_dir(self, node: str, what: str) -> str:
        """A directory for a Unix socket whose path stays below the length limit."""
        here = self.node_dir(node)
        if len(os.path.join(here, "mysqld.sock")) <= SOCKET_PATH_MAX:
            return here
        for path in self._outside:
            if os.path.basename(path).startswith(f"dlf{self.topo.run}-{what}-"):
                return path
        return self._outside_dir(what)

    def stop(self):
        try:
            super().stop()
        finally:
            for path in self._outside:
                shutil.rmtree(path, ignore_errors=True)
            self._outside.clear()

    def _run_in(self, argv: list[str], timeout: float = 20.0) -> subprocess.CompletedProcess:
        """argv inside the server's host, bounded; a timeout is a failed run, not an exception."""
        try:
            return self.host_of(self.node).run(argv, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout:g}s")

    def _poll(self, node: str, seconds: float, what: str, check):
        """Poll check() until true; fail early (with the log's tail) if the server exits."""
        proc = self.procs[node]
        end = time.monotonic() + seconds
        last = ""
        for _ in range(100000):
            if not proc.alive():
                raise RuntimeError(f"{self.backend} on {node} exited ({proc.returncode}) before {what}:\n{proc.tail()}")
            ok, last = check()
            if ok:
                return
            if time.monotonic() > end:
                break
            time.sleep(0.1)
        raise TimeoutError(f"{self.backend} on {node}: not {what} within {seconds:g}s ({last.strip()[-300:]})")


@register
class Postgres(_SingleServer):
    """PostgreSQL 14+ on host pg1, port 5432, TCP only; role `dlock` (trusted) in database
    postgres. The server settings dlock needs are session settings it sends itself
    (idle_session_timeout, client_connection_check_interval, keepalives)."""

    backend = "postgres"
    NODES = ["pg1"]
    PORT = 5432
    READY_S = 60.0

    def __init__(self, topo, workdir):
        super().__init__(topo, workdir)
        self._root: dict[str, str] = {}
        pw = pwd.getpwnam("postgres") if _has_user("postgres") else None
        self._uid = pw.pw_uid if pw else None
        self._gid = pw.pw_gid if pw else None

    def data_dir(self, node: str) -> str:
        return os.path.join(self._root.get(node, self.node_dir(node)), "data")

    def _as_postgres(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        if self._uid is None:
            raise RuntimeError("PostgreSQL refuses to run as root and there is no `postgres` user (apt-get install -y postgresql creates it)")
        return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--", *argv]

    def _give(self, path: str):
        if os.geteuid() == 0 and self._uid is not None:
            os.chown(path, self._uid, self._gid)

    def _postgres_can_write(self, path: str) -> bool:
        probe = subprocess.run(
            self._as_postgres(["test", "-w", path, "-a", "-x", path]),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=15,
            check=False,
        )
        return probe.returncode == 0

    def _prepare(self, node: str):
        if node not in self._root:
            root = self.node_dir(node)
            os.makedirs(root, exist_ok=True)
            self._give(root)
            if not self._postgres_can_write(root):
                # A workdir under a directory only root may enter (mkdtemp makes them 0700).
                root = self._outside_dir("pg")
                os.chmod(root, 0o755)
                self._give(root)
            self._root[node] = root
        data = self.data_dir(node)
        env = dict(os.environ, LC_ALL="C", LANG="C")
        initdb = subprocess.run(
            self._as_postgres(
                [_pg_bin("initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C"]
            ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=180,
            cwd=self._root[node],
            env=env,
            check=False,
        )
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb for {node} failed: {(initdb.stdout + initdb.stderr)[-2000:]}")
        # Every address may connect: traffic reaches the server only from our namespaces.
        hba = os.path.join(data, "pg_hba.conf")
        with open(hba, "w") as f:
            f.write("local all all trust\nhost all all 0.0.0.0/0 trust\n")
        self._give(hba)

    def _launch(self, node: str) -> procs.Proc:
        argv = self._as_postgres(
            [
                _pg_bin("postgres"),
                "-D",
                self.data_dir(node),
                "-p",
                str(self.PORT),
                "-c",
                f"listen_addresses={self.host_of(node).addr}",
                # TCP only: no socket path to keep short, no socket shared with anyone.
                "-c",
                "unix_socket_directories=",
                "-c",
                "max_connections=200",
                # A crash here is a process crash: the page cache survives it, so fsync only
                # loads the shared machine.
                "-c",
                "fsync=off",
            ]
        )
        return procs.start(
            self.host_of(node), argv, node, self.log_dir, env={"LC_ALL": "C", "LANG": "C"}, cwd=self._root.get(node)
        )

    def _psql(self, sql: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
        return self._run_in(
            [
                _pg_bin("psql"),
                "-X",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                self.addr(),
                "-p",
                str(self.PORT),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
                sql,
            ],
            timeout=timeout,
        )

    def _wait_ready(self, node: str, seconds: float):
        def ready():
            r = self._run_in([_pg_bin("pg_isready"), "-h", self.addr(), "-p", str(self.PORT), "-t", "2"], timeout=10)
            return r.returncode == 0, r.stdout + r.stderr

        self._poll(node, seconds, "accepting connections", ready)
        # The role dlock connects as; idempotent, so a restart may run it again.
        role = self._psql(
            "DO $$ BEGIN CREATE ROLE dlock LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        if role.returncode != 0:
            raise RuntimeError(f"postgres on {node}: creating role dlock failed: {role.stderr.strip()}")

    def url(self) -> str:
        return f"postgres://dlock@{self.addr()}:{self.PORT}/postgres?sslmode=disable"

    # The postmaster's backends each lead their own session: signal the whole tree.

    def _tree(self, node: str) -> tuple[procs.Proc | None, list[int]]:
        proc = self.procs.get(node)
        if proc is None:
            return None, []
        return proc, _children(proc.pid)

    def pause(self, node: str):
        proc, children = self._tree(node)
        if proc is None:
            return
        proc.pause()  # the postmaster first: it forks no more backends meanwhile
        _signal_all(children, signal.SIGSTOP)
        # A backend forked between the scan and the postmaster's stop.
        _signal_all([c for c in _children(proc.pid) if c not in children], signal.SIGSTOP)

    def resume(self, node: str):
        proc, children = self._tree(node)
        if proc is None:
            return
        _signal_all(children, signal.SIGCONT)
        proc.resume()

    def _kill_tree(self, node: str, first=signal.SIGKILL, grace: float = 0.0):
        """first to the postmaster (and, for SIGKILL, to every process it forked); after grace
        seconds, SIGKILL whatever of the tree is left; wait (bounded) until all are gone, so a
        new postmaster finds no old backend attached to the shared memory."""
        proc, children = self._tree(node)
        if proc is None:
            return
        if first != signal.SIGKILL and proc.alive():
            _signal_all([proc.pid], first)
            _signal_all([proc.pid, *children], signal.SIGCONT)
            try:
                proc.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        children = sorted(set(children) | set(_children(proc.pid)))
        proc.kill(signal.SIGKILL)
        _signal_all(children, signal.SIGKILL)
        _signal_all(children, signal.SIGCONT)
        try:
            procs.wait_until(f"postgres on {node} gone", lambda: not any(_alive(c) for c in children), 15.0, 0.05)
        except TimeoutError:
            pass

    def crash(self, node: str):
        self._kill_tree(node)

    def restart(self, node: str, wipe: bool = False):
        self._kill_tree(node)
        super().restart(node, wipe)

    def stop(self):
        try:
            for node in list(self.procs):
                # Fast shutdown (SIGTERM would wait for every client to disconnect).
                self._kill_tree(node, first=signal.SIGINT, grace=10.0)
        finally:
            super().stop()
            self._root.clear()


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@register
class Mysql(_SingleServer):
    """MariaDB on host my1, port 3306; user `dlock` (no password, from any address) with all
    privileges on database `dlock` plus PROCESS and CONNECTION ADMIN, as the suite's."""

    backend = "mysql"
    NODES = ["my1"]
    PORT = 3306
    READY_S = 90.0

    BOOTSTRAP = (
        "CREATE DATABASE IF NOT EXISTS dlock;\n"
        "CREATE USER IF NOT EXISTS 'dlock'@'%';\n"
        "GRANT ALL ON dlock.* TO 'dlock'@'%';\n"
        "GRANT PROCESS, CONNECTION ADMIN ON *.* TO 'dlock'@'%';\n"
    )

    def _tmp(self, node: str) -> str:
        # Its own tmpdir: a starting mariadbd deletes every #sql* file in it.
        return os.path.join(self.node_dir(node), "tmp")

    def _prepare(self, node: str):
        os.makedirs(self._tmp(node), exist_ok=True)
        argv = [
            _binary("mariadb-install-db", "mariadb-server"),
            "--no-defaults",
            f"--datadir={self.data_dir(node)}",
            f"--tmpdir={self._tmp(node)}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--innodb-log-file-size=8M",
        ]
        if os.geteuid() == 0:
            argv.append("--user=root")
        install = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, check=False
        )
        if install.returncode != 0:
            raise RuntimeError(f"mariadb-install-db for {node} failed: {(install.stdout + install.stderr)[-2000:]}")
        with open(os.path.join(self.node_dir(node), "bootstrap.sql"), "w") as f:
            f.write(self.BOOTSTRAP)

    def _launch(self, node: str) -> procs.Proc:
        d = self.node_dir(node)
        argv = [
            _binary("mariadbd", "mariadb-server"),
            "--no-defaults",
            f"--datadir={self.data_dir(node)}",
            f"--tmpdir={self._tmp(node)}",
            f"--port={self.PORT}",
            f"--bind-address={self.host_of(node).addr}",
            f"--socket={os.path.join(self._short_dir(node, 'my'), 'mysqld.sock')}",
            f"--pid-file={os.path.join(d, 'mysqld.pid')}",
            f"--log-error={os.path.join(self.log_dir, node + '.err')}",
            f"--init-file={os.path.join(d, 'bootstrap.sql')}",
            "--skip-log-bin",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=8M",
            "--performance-schema=OFF",
            "--max-connections=300",
        ]
        if os.geteuid() == 0:
            argv.append("--user=root")
        return procs.start(self.host_of(node), argv, node, self.log_dir)

    def _wait_ready(self, node: str, seconds: float):
        def ready():
            r = self._run_in(
                [
                    _binary("mariadb", "mariadb-client"),
                    "--no-defaults",
                    "-h",
                    self.addr(),
                    "-P",
                    str(self.PORT),
                    "-u",
                    "dlock",
                    "--connect-timeout=2",
                    "-N",
                    "-B",
                    "-e",
                    "SELECT 1",
                ],
                timeout=10,
            )
            return r.returncode == 0 and r.stdout.strip() == "1", r.stdout + r.stderr

        self._poll(node, seconds, "answering as user dlock", ready)

    def url(self) -> str:
        return f"mysql://dlock@{self.addr()}:{self.PORT}/dlock?ssl-mode=DISABLED"


@register
class Memcached(_SingleServer):
    """memcached on host mc1, port 11211, TCP only, with -M (no evictions, which dlock
    requires) and -o no_slab_reassign, as docs/backends/memcached.md says to run it. It keeps
    nothing across a restart: every restart is a wipe."""

    backend = "memcached"
    NODES = ["mc1"]
    PORT = 11211
    FAULTS = frozenset({"network", "pause", "crash", "leader", "restart-wipe"})

    def _launch(self, node: str) -> procs.Proc:
        user = pwd.getpwuid(os.geteuid()).pw_name
        argv = [
            _binary("memcached", "memcached"),
            "-p",
            str(self.PORT),
            "-l",
            self.host_of(node).addr,
            "-U",
            "0",
            "-u",
            user,
            "-m",
            "64",
            "-c",
            "4096",
            "-M",
            "-o",
            "no_slab_reassign",
        ]
        return procs.start(self.host_of(node), argv, node, self.log_dir)

    def _wait_ready(self, node: str, seconds: float):
        def ready():
            answer = procs.connect_in(self.host_of(node), self.addr(), self.PORT, b"version\r\nquit\r\n")
            return answer is not None and b"VERSION" in answer, repr(answer)

        self._poll(node, seconds, "answering version", ready)

    def url(self) -> str:
        return f"memcached://{self.addr()}:{self.PORT}"


@register
class File(Deployment):
    """The file backend: lock files in <workdir>/file/locks, no server and no server host.
    Its clients may run on any client host: file locks are per kernel, so every namespace of
    this machine sees the same locks."""

    backend = "file"
    NODES: list[str] = []
    FAULTS = frozenset()

    def locks_dir(self) -> str:
        return os.path.join(os.path.abspath(self.dir), "locks")

    def _after_start(self):
        os.makedirs(self.locks_dir(), exist_ok=True)

    def server_hosts(self):
        return []

    def url(self) -> str:
        return f"file://{self.locks_dir()}"
