"""The key-value backends as real multi-node deployments, one host per server process:
etcd (3 members), ZooKeeper (3-node ensemble), Redis (one server, no persistence), Redis
behind Sentinel (master + 2 replicas, 3 sentinels), Redis Cluster (3 masters + 3 replicas).

Every server listens on its host's address (and loopback inside its namespace, so it can be
asked about itself while cut off), on the backend's usual port: hosts have addresses of their
own, so ports never collide. Readiness and leaders are asked from inside the node's own host.

Run `python3 -m faultlib.deploy_kv [backend ...]` (from scripts/, as root) for the self-test:
each deployment started, `dlock run` from a client host, the leader crashed and restarted,
`dlock run` again, everything stopped and removed, with the time each step took.
"""

import json
import os
import re
import shutil
import subprocess
import time

from . import procs
from .deploy import Deployment, register

PATIENCE_S = 60.0


def _ask_redis(host, addr: str, port: int, *args: str, timeout: float = 3.0) -> str | None:
    """One command with redis-cli from inside host; its output, None when it did not answer."""
    try:
        done = host.run(["redis-cli", "-h", addr, "-p", str(port), *args], timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    out = done.stdout
    if done.returncode != 0 or out.startswith("Could not connect") or "Connection refused" in out:
        return None
    return out


def _info(text: str | None) -> dict[str, str]:
    fields = {}
    for line in (text or "").splitlines():
        key, sep, value = line.strip().partition(":")
        if sep:
            fields[key] = value
    return fields


def _majority(values: list, total: int):
    """The value more than half of total voters gave, else None."""
    for v in set(values):
        if v is not None and values.count(v) * 2 > total:
            return v
    return None


# --- etcd ------------------------------------------------------------------------------


@register
class Etcd(Deployment):
    """Three etcd members etcd1..etcd3 (client 2379, peer 2380), default raft timing
    (heartbeat 100 ms, election 1 s). TTL 3 s: etcd's minimum lease is about 2 s."""

    backend = "etcd"
    ttl = "3s"
    NODES = ["etcd1", "etcd2", "etcd3"]
    FAULTS = frozenset({"network", "pause", "crash", "leader", "failover"})
    CLIENT, PEER = 2379, 2380
    # On SIGTERM the leader tries to hand its leadership to members that are stopping too.
    STOP_S = 1.0

    def __init__(self, topo, workdir):
        super().__init__(topo, workdir)
        self._member_ids: dict[int, str] = {}

    def url(self):
        return "etcd://" + ",".join(f"{h.addr}:{self.CLIENT}" for h in self.server_hosts())

    def _launch(self, node):
        addr = self.host_of(node).addr
        cluster = ",".join(f"{n}=http://{self.host_of(n).addr}:{self.PEER}" for n in self.nodes())
        argv = [
            "etcd",
            "--name", node,
            "--data-dir", self.data_dir(node),
            "--listen-client-urls", f"http://{addr}:{self.CLIENT},http://127.0.0.1:{self.CLIENT}",
            "--advertise-client-urls", f"http://{addr}:{self.CLIENT}",
            "--listen-peer-urls", f"http://{addr}:{self.PEER}",
            "--initial-advertise-peer-urls", f"http://{addr}:{self.PEER}",
            "--initial-cluster", cluster,
            "--initial-cluster-token", f"dlf{self.topo.run}-etcd",
            "--initial-cluster-state", "new",
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]  # fmt: skip
        return procs.start(self.host_of(node), argv, node, self.log_dir, env={"ETCD_UNSUPPORTED_ARCH": None})

    def _healthy(self, node) -> bool:
        reply = procs.connect_in(
            self.host_of(node),
            "127.0.0.1",
            self.CLIENT,
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        )
        return reply is not None and b'"health":"true"' in reply

    def _wait_ready(self, node, seconds):
        proc = self.procs[node]

        def ready():
            if not proc.alive():
                raise RuntimeError(f"etcd {node} exited ({proc.returncode}):\n{proc.tail()}")
            return self._healthy(node)

        procs.wait_until(f"etcd {node} healthy", ready, seconds, interval=0.2)

    def _status(self, node) -> dict | None:
        try:
            done = self.host_of(node).run(
                ["etcdctl", f"--endpoints=http://127.0.0.1:{self.CLIENT}", "--command-timeout=2s",
                 "endpoint", "status", "-w", "json"],
                timeout=5,
                env={**os.environ, "ETCDCTL_API": "3"},
            )  # fmt: skip
            return json.loads(done.stdout)[0]["Status"] if done.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError, KeyError, IndexError):
            return None

    def _after_start(self):
        for node in self.nodes():
            status = procs.wait_until(f"etcd {node} status", lambda: self._status(node), PATIENCE_S)
            self._member_ids[status["header"]["member_id"]] = node
        procs.wait_until("an etcd leader", self.leader, PATIENCE_S)

    def leader(self, name=None):
        """The member a majority of the members names leader now (asked each on its own host,
        so a member cut off answers too), else None."""
        leaders = []
        for node in self.nodes():
            if not self.alive(node) or self.procs[node].paused:
                continue
            status = self._status(node)
            if status and status.get("leader"):
                leaders.append(status["leader"])
        chosen = _majority(leaders, len(self.nodes()))
        return self._member_ids.get(chosen) if chosen else None


# --- ZooKeeper -------------------------------------------------------------------------


@register
class ZooKeeper(Deployment):
    """A three-node ensemble zk1..zk3 (client 2181, quorum 2888, election 3888). tickTime 500 ms:
    sessions of 1 s to 10 s, the 4 s TTL among them; a follower cut off is dropped after
    syncLimit (5 ticks). One small JVM each (-Xmx128m, serial GC, C1 only)."""

    backend = "zookeeper"
    ttl = "4s"
    NODES = ["zk1", "zk2", "zk3"]
    FAULTS = frozenset({"network", "pause", "crash", "leader", "failover"})
    READY_S = 90.0
    CLIENT, QUORUM, ELECTION = 2181, 2888, 3888
    TICK_MS = 500
    JARS = ["/usr/share/java/zookeeper.jar", "/usr/share/java/zookeeper-jute.jar", "/usr/share/java/slf4j-simple.jar"]

    def url(self):
        return "zk://" + ",".join(f"{h.addr}:{self.CLIENT}" for h in self.server_hosts())

    def _prepare(self, node):
        for jar in self.JARS:
            if not os.path.isfile(jar):
                raise RuntimeError(f"{jar} is missing: apt-get install -y zookeeper")
        os.makedirs(self.data_dir(node), exist_ok=True)
        myid = self.nodes().index(node) + 1
        with open(os.path.join(self.data_dir(node), "myid"), "w") as f:
            f.write(f"{myid}\n")
        lines = [
            f"tickTime={self.TICK_MS}",
            "initLimit=20",
            "syncLimit=5",
            f"dataDir={self.data_dir(node)}",
            f"clientPort={self.CLIENT}",
            "admin.enableServer=false",
            "autopurge.purgeInterval=0",
            "maxClientCnxns=0",
            "4lw.commands.whitelist=srvr,mntr,ruok,stat,cons",
        ]
        for i, n in enumerate(self.nodes()):
            lines.append(f"server.{i + 1}={self.host_of(n).addr}:{self.QUORUM}:{self.ELECTION}")
        with open(os.path.join(self.node_dir(node), "zoo.cfg"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def _launch(self, node):
        argv = [
            "java",
            "-Xms16m", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-XX:ActiveProcessorCount=1", "-Xss512k",
            "-Djava.net.preferIPv4Stack=true",
            "-Dzookeeper.admin.enableServer=false",
            # An election connection to a cut-off peer gives up after 2 s, not 5.
            "-Dzookeeper.cnxTimeout=2000",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            f"-Dzookeeper.log.dir={self.log_dir}",
            "-cp", ":".join(self.JARS),
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            os.path.join(self.node_dir(node), "zoo.cfg"),
        ]  # fmt: skip
        return procs.start(self.host_of(node), argv, node, self.log_dir)

    def _srvr(self, node) -> dict[str, str]:
        reply = procs.connect_in(self.host_of(node), "127.0.0.1", self.CLIENT, b"srvr")
        fields = {}
        for line in (reply or b"").decode(errors="replace").splitlines():
            key, sep, value = line.partition(": ")
            if sep:
                fields[key.strip()] = value.strip()
        return fields

    def mode(self, node) -> str | None:
        return self._srvr(node).get("Mode")

    def _wait_ready(self, node, seconds):
        proc = self.procs[node]

        def ready():
            if not proc.alive():
                raise RuntimeError(f"zookeeper {node} exited ({proc.returncode}):\n{proc.tail()}")
            return self.mode(node) in ("leader", "follower")

        procs.wait_until(f"zookeeper {node} serving (srvr Mode leader/follower)", ready, seconds, interval=0.3)

    def _after_start(self):
        procs.wait_until("a zookeeper leader", self.leader, PATIENCE_S)

    def leader(self, name=None):
        """The node that says "Mode: leader" with the highest epoch (a leader cut off keeps
        saying so for up to syncLimit ticks, in an older epoch once another is elected)."""
        best = None
        for node in self.nodes():
            if not self.alive(node) or self.procs[node].paused:
                continue
            fields = self._srvr(node)
            if fields.get("Mode") != "leader":
                continue
            try:
                epoch = int(fields.get("Zxid", "0x0"), 16) >> 32
            except ValueError:
                epoch = 0
            if best is None or epoch > best[0]:
                best = (epoch, node)
        return best[1] if best else None


# --- Redis -----------------------------------------------------------------------------


class _RedisNodes(Deployment):
    """Redis data nodes from a config file each (so that what Sentinel or the cluster
    rewrites into it survives a restart), listening on the host's address and loopback."""

    PORT = 6379
    # Persistence of the data nodes; docs/backends/redis.md asks for appendonly yes.
    PERSIST = ["appendonly yes", "appendfsync everysec", 'save ""']

    def _redis_conf(self, node) -> list[str]:
        return []

    def _prepare(self, node):
        os.makedirs(self.data_dir(node), exist_ok=True)
        conf = os.path.join(self.node_dir(node), "redis.conf")
        if os.path.exists(conf):
            # Keep what Sentinel or the cluster wrote into it (a wipe loses data, not role).
            return
        lines = [
            f"bind {self.host_of(node).addr} 127.0.0.1",
            f"port {self.PORT}",
            "protected-mode no",
            "daemonize no",
            f"dir {self.data_dir(node)}",
            "maxmemory-policy noeviction",
            # A replica (re)joining gets its copy at once, not after the default 5 s wait.
            "repl-diskless-sync-delay 0",
            *self.PERSIST,
            *self._redis_conf(node),
        ]
        with open(conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _launch(self, node):
        return procs.start(
            self.host_of(node), ["redis-server", os.path.join(self.node_dir(node), "redis.conf")], node, self.log_dir
        )

    def ask(self, node, *args, port=None, timeout=3.0) -> str | None:
        """A redis-cli command to node (on its own host, over loopback)."""
        return _ask_redis(self.host_of(node), "127.0.0.1", port or self.PORT, *args, timeout=timeout)

    def _wait_ready(self, node, seconds):
        proc = self.procs[node]

        def ready():
            if not proc.alive():
                raise RuntimeError(f"redis {node} exited ({proc.returncode}):\n{proc.tail()}")
            reply = self.ask(node, "PING")
            return reply is not None and "PONG" in reply

        procs.wait_until(f"redis {node} answers PING", ready, seconds, interval=0.1)


@register
class Redis(_RedisNodes):
    """One Redis server redis1 without persistence (`save ""`, `appendonly no`): a restart loses
    every lock, so restart and restart(wipe) are the same real mode. TTL 3 s."""

    backend = "redis"
    ttl = "3s"
    NODES = ["redis1"]
    FAULTS = frozenset({"network", "pause", "crash", "restart-wipe", "leader"})
    PERSIST = ['save ""', "appendonly no"]

    def url(self):
        return f"redis://{self.host_of('redis1').addr}:{self.PORT}"

    def leader(self, name=None):
        return "redis1" if self.alive("redis1") else None


@register
class RedisSentinel(_RedisNodes):
    """A master r1 with replicas r2, r3 (AOF on, as docs/backends/redis.md asks) and three
    sentinels s1..s3 (port 26379) on hosts of their own, quorum 2, down-after 1 s and
    failover-timeout 3 s, so a failover completes within a few seconds.

    Sentinels on their own hosts, not beside the data nodes: the process count (and so CPU)
    is the same either way, and separate hosts let a nemesis cut the master off while all three
    sentinels stay on the majority side, or cut sentinels alone. TTL 3 s."""

    backend = "redis-sentinel"
    ttl = "3s"
    DATA = ["r1", "r2", "r3"]
    SENTINELS = ["s1", "s2", "s3"]
    NODES = DATA + SENTINELS
    FAULTS = frozenset({"network", "pause", "crash", "leader", "failover"})
    SENTINEL_PORT = 26379
    MASTER = "mymaster"

    def data_nodes(self) -> list[str]:
        return list(self.DATA)

    def _phases(self):
        return [self.DATA, self.SENTINELS]

    def url(self):
        sentinels = ",".join(f"{self.host_of(s).addr}:{self.SENTINEL_PORT}" for s in self.SENTINELS)
        return f"redis-sentinel://{sentinels}/0#{self.MASTER}"

    def _redis_conf(self, node):
        if node != self.DATA[0]:
            return [f"replicaof {self.host_of(self.DATA[0]).addr} {self.PORT}"]
        return []

    def _prepare(self, node):
        if node in self.DATA:
            return super()._prepare(node)
        os.makedirs(self.node_dir(node), exist_ok=True)
        conf = os.path.join(self.node_dir(node), "sentinel.conf")
        if os.path.exists(conf):
            return
        master = self.host_of(self.DATA[0]).addr
        lines = [
            f"bind {self.host_of(node).addr} 127.0.0.1",
            f"port {self.SENTINEL_PORT}",
            "protected-mode no",
            "daemonize no",
            f"dir {self.node_dir(node)}",
            f"sentinel monitor {self.MASTER} {master} {self.PORT} 2",
            f"sentinel down-after-milliseconds {self.MASTER} 1000",
            f"sentinel failover-timeout {self.MASTER} 3000",
            f"sentinel parallel-syncs {self.MASTER} 1",
        ]
        with open(conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _launch(self, node):
        if node in self.DATA:
            return super()._launch(node)
        return procs.start(
            self.host_of(node), ["redis-sentinel", os.path.join(self.node_dir(node), "sentinel.conf")], node, self.log_dir
        )

    def _wait_ready(self, node, seconds):
        if node in self.DATA:
            super()._wait_ready(node, seconds)
            if not self.started and node != self.DATA[0]:
                # At start, replicas in sync before the sentinels look (they list replicas from
                # the master's INFO, asked every 10 s): the group is whole at their first look.
                procs.wait_until(
                    f"{node} in sync with the master",
                    lambda: "master_link_status:up" in (self.ask(node, "INFO", "replication") or ""),
                    seconds,
                    0.1,
                )
            return
        proc = self.procs[node]

        def ready():
            if not proc.alive():
                raise RuntimeError(f"sentinel {node} exited ({proc.returncode}):\n{proc.tail()}")
            reply = self.ask(node, "PING", port=self.SENTINEL_PORT)
            return reply is not None and "PONG" in reply

        procs.wait_until(f"sentinel {node} answers PING", ready, seconds, interval=0.1)

    def _master_addr(self, sentinel) -> str | None:
        reply = self.ask(sentinel, "SENTINEL", "get-master-addr-by-name", self.MASTER, port=self.SENTINEL_PORT)
        lines = (reply or "").split()
        return lines[0] if len(lines) == 2 else None

    def _ready(self) -> bool:
        master = self.leader()
        if master is None:
            return False
        for node in self.DATA:
            if node != master and "master_link_status:up" not in (self.ask(node, "INFO", "replication") or ""):
                return False
        for s in self.SENTINELS:
            info = _info(self.ask(s, "INFO", "sentinel", port=self.SENTINEL_PORT))
            status = info.get("master0", "")
            if "status=ok" not in status or "slaves=2" not in status or "sentinels=3" not in status:
                return False
        return True

    def _after_start(self):
        procs.wait_until("sentinels know the master, 2 replicas in sync and each other", self._ready, PATIENCE_S, 0.2)

    def restart(self, node, wipe=False):
        master = self.leader() if node in self.DATA else None
        if master is not None and master != node:
            # What the sentinels would have written into its config, had it been up to hear
            # them (they rewrite the config of every node they reconfigure): it comes back as a
            # replica of the current master, not as a second master for the seconds until the
            # sentinels notice and convert it.
            self._set_replicaof(node, self.host_of(master).addr)
        super().restart(node, wipe)
        if node in self.SENTINELS:
            return
        # A data node back from a crash: wait until it serves in the role the sentinels give it
        # (a former master is turned into a replica of the new one) and is in sync.
        def settled():
            master = self.leader()
            if master is None:
                return False
            if node == master:
                return True
            return "master_link_status:up" in (self.ask(node, "INFO", "replication") or "")

        procs.wait_until(f"{node} back in the sentinels' group", settled, PATIENCE_S, 0.2)

    def _set_replicaof(self, node, master_addr):
        conf = os.path.join(self.node_dir(node), "redis.conf")
        with open(conf) as f:
            lines = [line for line in f.read().splitlines() if not re.match(r"^\s*(replicaof|slaveof)\s", line)]
        lines.append(f"replicaof {master_addr} {self.PORT}")
        with open(conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def leader(self, name=None):
        """The data node a majority of the sentinels names master (None without a majority)."""
        by_addr = {self.host_of(n).addr: n for n in self.DATA}
        names = []
        for s in self.SENTINELS:
            if self.alive(s) and not self.procs[s].paused:
                names.append(by_addr.get(self._master_addr(s) or ""))
        return _majority(names, len(self.SENTINELS))


def _crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), Redis Cluster's key hash."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def lock_slot(name: str) -> int:
    """The Cluster slot of dlock's keys for lock `name`: they share the hash tag
    `{<encoded name>}` (src/backend/redis/keys.rs; encoding: src/lock.rs encode_component)."""
    encoded = "".join(
        chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "._-") else f"%{b:02X}" for b in name.encode()
    )
    return _crc16(encoded.encode()) % 16384


@register
class RedisCluster(_RedisNodes):
    """Six cluster nodes rc1..rc6 (3 masters, 3 replicas, `redis-cli --cluster create
    --cluster-replicas 1`), cluster-node-timeout 1 s, AOF on; each announces its host address.
    TTL 3 s."""

    backend = "redis-cluster"
    ttl = "3s"
    NODES = ["rc1", "rc2", "rc3", "rc4", "rc5", "rc6"]
    FAULTS = frozenset({"network", "pause", "crash", "leader", "failover"})

    def url(self):
        return "redis://" + ",".join(f"{h.addr}:{self.PORT}" for h in self.server_hosts())

    def _redis_conf(self, node):
        return [
            "cluster-enabled yes",
            "cluster-node-timeout 1000",
            f"cluster-config-file {os.path.join(self.data_dir(node), 'nodes.conf')}",
            f"cluster-announce-ip {self.host_of(node).addr}",
        ]

    def _nodes_view(self, node) -> list[dict]:
        """CLUSTER NODES as node sees it: [{addr, flags, master_of, slots}]."""
        rows = []
        for line in (self.ask(node, "CLUSTER", "NODES") or "").splitlines():
            parts = line.split()
            if len(parts) < 8:
                continue
            slots = []
            for s in parts[8:]:
                if s.startswith("["):
                    continue
                lo, _, hi = s.partition("-")
                slots.append((int(lo), int(hi or lo)))
            rows.append({"id": parts[0], "addr": parts[1].split("@")[0].rsplit(":", 1)[0],
                         "flags": parts[2].split(","), "master": parts[3], "slots": slots})  # fmt: skip
        return rows

    def _state_ok(self, node) -> bool:
        return "cluster_state:ok" in (self.ask(node, "CLUSTER", "INFO") or "")

    def _after_start(self):
        first = self.host_of(self.NODES[0])
        nodes = [f"{self.host_of(n).addr}:{self.PORT}" for n in self.NODES]
        done = first.run(
            ["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "1", "--cluster-yes"], timeout=PATIENCE_S
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        procs.wait_until("cluster_state:ok on every node", lambda: all(self._state_ok(n) for n in self.NODES), PATIENCE_S, 0.2)

        def replicas_in_sync():
            masters = 0
            for n in self.NODES:
                info = _info(self.ask(n, "INFO", "replication"))
                if info.get("role") == "master":
                    masters += 1
                elif info.get("master_link_status") != "up":
                    return False
            return masters == 3

        procs.wait_until("3 masters, 3 replicas in sync", replicas_in_sync, PATIENCE_S, 0.2)

    def restart(self, node, wipe=False):
        super().restart(node, wipe)
        procs.wait_until(
            f"{node} back in the cluster (cluster_state:ok)",
            lambda: self._state_ok(node) and all(self._state_ok(n) for n in self.NODES if self.alive(n)),
            PATIENCE_S,
            0.2,
        )

    def masters(self) -> dict[str, list[tuple[int, int]]]:
        """node -> slot ranges, as the majority of live nodes sees the masters now."""
        by_addr = {self.host_of(n).addr: n for n in self.NODES}
        views = []
        for n in self.NODES:
            if not self.alive(n) or self.procs[n].paused:
                continue
            view = {}
            for row in self._nodes_view(n):
                if "master" in row["flags"] and "fail" not in row["flags"] and row["slots"]:
                    view[by_addr.get(row["addr"], row["addr"])] = tuple(row["slots"])
            views.append(tuple(sorted(view.items())))
        chosen = _majority(views, len(views)) if views else None
        return {k: list(v) for k, v in chosen} if chosen else {}

    def leader(self, name=None):
        """The master serving lock `name`'s slot (without a name: slot 0's), as a majority of
        the live nodes sees it; None while they disagree."""
        slot = lock_slot(name) if name is not None else 0
        for node, ranges in self.masters().items():
            if any(lo <= slot <= hi for lo, hi in ranges):
                return node
        return None


# --- self-test -------------------------------------------------------------------------


def _selftest(backends: list[str]) -> int:
    from . import net

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    dlock = os.environ.get("DLOCK", os.path.join(repo, "target", "debug", "dlock"))
    workdir = os.environ.get("SELFTEST_DIR", f"/tmp/dlf-selftest-{os.getpid()}")
    net.exit_on_signals()
    net.cleanup_stale()
    failures = 0
    ours = set()
    for backend in backends:
        topo = net.Topology(None, os.path.join(workdir, backend))
        ours.add(f"dlf{topo.run}")
        d = None
        try:
            client = topo.add_host("c1")
            d = _deployment_class(backend)(topo, workdir)

            def step(label, fn):
                t0 = time.monotonic()
                value = fn()
                print(f"  {backend:15} {label:38} {time.monotonic() - t0:6.2f}s {'' if value is None else value}", flush=True)
                return value

            def dlock_run():
                done = client.run([dlock, "run", "--url", d.url(), "--ttl", d.ttl, "--wait", "30s", "x", "--", "true"], timeout=90)
                if done.returncode != 0:
                    raise RuntimeError(f"dlock run exit {done.returncode}: {done.stderr.strip()}")
                return "rc 0"

            step("start", d.start)
            print(f"  {backend:15} url {d.url()} ttl {d.ttl}", flush=True)
            step("dlock run", dlock_run)
            leader = step("leader", d.leader)
            step(f"crash {leader}", lambda: d.crash(leader))
            if d.supports("failover"):
                step("new leader elected", lambda: procs.wait_until("new leader", lambda: d.leader() not in (None, leader) and d.leader(), PATIENCE_S, 0.2))
                step("dlock run (old leader down)", dlock_run)
            step(f"restart {leader}", lambda: d.restart(leader))
            step("leader", lambda: procs.wait_until("a leader", d.leader, PATIENCE_S, 0.2))
            step("dlock run", dlock_run)
            if d.supports("restart-wipe"):
                step(f"restart {leader} wiped", lambda: d.restart(leader, wipe=True))
                step("dlock run", dlock_run)
        except Exception as e:
            failures += 1
            print(f"  {backend:15} FAILED: {type(e).__name__}: {e}", flush=True)
        finally:
            t0 = time.monotonic()
            if d is not None:
                d.stop()
            topo.close()
            print(f"  {backend:15} {'stop + namespaces removed':38} {time.monotonic() - t0:6.2f}s", flush=True)
    left = [n for n in net.list_namespaces() if n.split("-")[0] in ours]
    print(f"namespaces of ours left: {left or 'none'}; processes left: {[p.pid for p in procs._live.values() if p.alive()] or 'none'}")
    if failures or left:
        print(f"logs and data kept in {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _deployment_class(backend: str):
    from .deploy import DEPLOYMENTS

    return DEPLOYMENTS[backend]


if __name__ == "__main__":
    import sys

    sys.exit(_selftest(sys.argv[1:] or ["etcd", "zookeeper", "redis", "redis-sentinel", "redis-cluster"]))
