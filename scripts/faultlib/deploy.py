"""A backend's servers as a real deployment on hosts of a Topology: the base class every
deployment derives from, and the registry DEPLOYMENTS (backend name -> class), filled by
deploy_kv.py and deploy_sql.py (both imported at the end of this module).

A subclass names its nodes (each node is a host of the same name running one server process)
and says how to prepare, launch and wait for one node; the base class does the rest:
start/stop, pause/resume/crash by pid, restart with or without the node's data.

supports(fault) vocabulary (a nemesis asks before acting):
  "network"       the deployment has server hosts a network fault can cut
  "pause"         pause(node)/resume(node) of a server process
  "crash"         crash(node) then restart(node) keeping its data
  "restart-wipe"  restart(node, wipe=True) is a real mode of the backend (the data is gone
                  on a restart as configured: redis without persistence, memcached)
  "leader"        leader() names a node that matters more than the others
  "failover"      losing the leader makes another node take over (etcd, zookeeper, sentinel,
                  cluster); without it, losing the only server means unavailability
"""

import importlib
import os
import shutil
import signal
import time

from . import procs
from .net import Host, Topology

DEPLOYMENTS: dict[str, type["Deployment"]] = {}


def register(cls):
    """Class decorator: DEPLOYMENTS[cls.backend] = cls."""
    DEPLOYMENTS[cls.backend] = cls
    return cls


class Deployment:
    """One backend's servers. Subclasses set `backend`, `ttl`, `FAULTS`, NODES (or override
    nodes()) and implement _prepare(node), _launch(node) -> Proc, _wait_ready(node, seconds),
    url(); optionally _after_start() (e.g. form a cluster, wait for a leader) and leader()."""

    backend: str = ""
    ttl: str = "3s"
    NODES: list[str] = []
    FAULTS: frozenset[str] = frozenset()
    # Seconds a node may take to become ready after launch.
    READY_S: float = 30.0
    # Seconds stop() gives the servers after SIGTERM before SIGKILL (their data is thrown away).
    STOP_S: float = 3.0

    def __init__(self, topo: Topology, workdir: str):
        self.topo = topo
        self.dir = os.path.join(workdir, self.backend or "deployment")
        self.log_dir = os.path.join(self.dir, "logs")
        self.procs: dict[str, procs.Proc] = {}
        self.extra_env: dict[str, str] = {}
        self.started = False
        # Seconds the last start() and stop() took (reported by the self-test and the harness).
        self.start_s: float | None = None
        self.stop_s: float | None = None

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(self.nodes())})"

    # --- what subclasses provide -------------------------------------------------------

    def nodes(self) -> list[str]:
        return list(self.NODES)

    def _prepare(self, node: str):
        """Write node's configuration and (empty) data directory."""

    def _launch(self, node: str) -> procs.Proc:
        raise NotImplementedError

    def _wait_ready(self, node: str, seconds: float):
        raise NotImplementedError

    def _phases(self) -> list[list[str]]:
        """Groups of nodes launched together, each group ready before the next is launched."""
        return [self.nodes()]

    def _after_start(self):
        """Runs once every node is ready (form a cluster, wait for a leader ...)."""

    def url(self) -> str:
        raise NotImplementedError

    def leader(self, name: str | None = None) -> str | None:
        """The leader / master node now, None if there is none (or none agreed on). name: the
        lock whose server matters, where that differs by lock (Redis Cluster: its slot's master)."""
        return None

    def data_nodes(self) -> list[str]:
        """The nodes holding lock data (Sentinel: the Redis servers, not the sentinels)."""
        return self.nodes()

    # --- common ------------------------------------------------------------------------

    def node_dir(self, node: str) -> str:
        return os.path.join(self.dir, node)

    def data_dir(self, node: str) -> str:
        return os.path.join(self.node_dir(node), "data")

    def host_of(self, node: str) -> Host:
        return self.topo.host(node)

    def server_hosts(self) -> list[Host]:
        return [self.topo.host(n) for n in self.nodes()]

    def proc(self, node: str) -> procs.Proc | None:
        return self.procs.get(node)

    def supports(self, fault: str) -> bool:
        return fault in self.FAULTS

    def start(self):
        """Create the server hosts, start every node, wait until each serves."""
        t0 = time.monotonic()
        if os.path.isdir(self.dir):
            shutil.rmtree(self.dir)
        os.makedirs(self.log_dir, exist_ok=True)
        for node in self.nodes():
            self.topo.ensure_host(node)
        for node in self.nodes():
            self._prepare(node)
        for phase in self._phases():
            for node in phase:
                self.procs[node] = self._launch(node)
            for node in phase:
                self._wait_ready(node, self.READY_S)
        self._after_start()
        self.started = True
        self.start_s = time.monotonic() - t0

    def stop(self):
        """Stop every server process (SIGTERM to all, then each waited for, SIGKILL after STOP_S).
        Idempotent. The hosts stay (the Topology owns them)."""
        t0 = time.monotonic()
        running = [p for p in self.procs.values() if p.alive()]
        for p in running:
            p._group(signal.SIGTERM)
            p._group(signal.SIGCONT)
        for p in self.procs.values():
            p.stop(self.STOP_S)
        self.procs.clear()
        self.started = False
        self.stop_s = time.monotonic() - t0

    def pause(self, node: str):
        self.procs[node].pause()

    def resume(self, node: str):
        self.procs[node].resume()

    def crash(self, node: str):
        """SIGKILL the node's process group and reap it."""
        self.procs[node].kill(signal.SIGKILL)

    def restart(self, node: str, wipe: bool = False):
        """Start the node again (killing it first if it still runs; wipe: without its data)
        and wait until it serves."""
        old = self.procs.get(node)
        if old is not None and old.alive():
            old.kill(signal.SIGKILL)
        if wipe:
            shutil.rmtree(self.data_dir(node), ignore_errors=True)
            self._prepare(node)
        self.procs[node] = self._launch(node)
        self._wait_ready(node, self.READY_S)

    def alive(self, node: str) -> bool:
        p = self.procs.get(node)
        return p is not None and p.alive()


def _load():
    for module in ("deploy_kv", "deploy_sql"):
        name = f"{__package__}.{module}"
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            # Only a module not written yet is tolerated, never a missing import inside one.
            if e.name != name:
                raise


_load()
