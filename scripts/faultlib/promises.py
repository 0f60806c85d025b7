"""What docs/guarantees.md promises for one backend under one nemesis, as numbers the checker
can hold a cell to.

Every cell is held to three promises whatever the fault:
- no stale token accepted by the fencing resource, and tokens strictly increasing per name
  (guarantees.md, promise 2, "It gives the command a fencing token": "strictly increases with
  every acquisition of the name"; the backend pages say how each keeps it across restarts);
- no hung run: every run ends within its --wait plus the bound the workload states;
- every name is taken again after the fault healed, within the phase's recovery time (a
  liveness expectation of the harness, not a sentence of guarantees.md: said so in the cell).

And to an overlap bound, chosen here (max_overlap_ms: 0 = none allowed, a number = the
documented bound, None = no bound: dlock itself was paused longer than its margin, so only
the tokens protect), plus, where the page states one, a bound on how long the name stays
unavailable after the fault (recovery_ms).

Nemesis names are H2's (scripts/faultlib/nemesis.py); they are matched by what they do:
  none; pause-holder*; crash-holder; clock-*; crash-wipe*; and server/network faults
  (isolate-node, majority-minority, isolate-holder, one-way, flapping, loss, pause-leader*,
  crash-leader).
"""

from dataclasses import dataclass, field

P1 = "Guarantees and limits, promise 1 (\"It stops the command before the lock can be handed to someone else\")"
P2 = "Guarantees and limits, promise 2 (\"It gives the command a fencing token\")"
SLACK_S = 3.0  # scheduling on a loaded 2-core machine, a waiter's own start and connect


@dataclass
class Promise:
    text: str
    sections: list[str] = field(default_factory=list)
    max_overlap_ms: float | None = 0.0
    recovery_ms: float | None = None
    recovery_text: str = ""
    # --wait bounds the time before the command starts (None: not checked for this backend).
    wait_bound_ms: float | None = None

    def as_dict(self) -> dict:
        return {
            "text": self.text, "sections": self.sections,
            "max_overlap_ms": self.max_overlap_ms, "recovery_ms": self.recovery_ms,
            "recovery_text": self.recovery_text, "wait_bound_ms": self.wait_bound_ms,
        }


def safe_pause_s(ttl_s: float) -> float:
    """The longest pause of a holding dlock after which it still stops its command before the
    server can expire the lease: the lease runs from the last acknowledged renewal's send, the
    next renewal is due a renewal interval (at most TTL/3) later, and on waking dlock needs the
    margin max(500ms, TTL/10) (+ 0.01·TTL drift allowance) to stop the command."""
    return ttl_s - ttl_s / 3.0 - max(0.5, ttl_s / 10.0) - 0.01 * ttl_s


def kind_of(nemesis: str) -> str:
    n = nemesis.lower()
    if n in ("none", "baseline"):
        return "none"
    if "holder" in n and "pause" in n:
        return "pause-holder"
    if "holder" in n and ("crash" in n or "kill" in n):
        return "crash-holder"
    if "clock" in n or "skew" in n:
        return "clock"
    if "wipe" in n:
        return "wipe"
    if "isolate-holder" in n or ("holder" in n and ("one-way" in n or "oneway" in n)):
        return "client-net"
    if "crash" in n or "restart" in n or "kill" in n:
        return "server-crash"
    if "pause" in n:
        return "server-pause"
    return "server-net"


def _failover_bound(ttl_s: float, kill_after_s: float) -> float:
    return (ttl_s / 3.0 + 1.0 + kill_after_s) * 1000.0


def promise_for(backend: str, nemesis: str, *, ttl_s: float, kill_after_s: float,
                wait_s: float, url: str = "", pause_s: float | None = None,
                holder_net: bool = False) -> Promise:
    """The promise for one cell. holder_net: the nemesis cuts only the holder's client host
    (H2's class attribute), which makes no server fail over."""
    kind = kind_of(nemesis)
    if holder_net and kind == "server-net":
        kind = "client-net"
    lease = backend not in ("file",)
    p = Promise(text="", sections=[P2])
    if backend == "etcd":
        p.wait_bound_ms = (max(wait_s, 2.0) + SLACK_S) * 1000.0
    failover = backend in ("redis-sentinel", "redis-cluster")
    replicas = "replicas=" in url

    def none_(why: str, *sections: str):
        p.max_overlap_ms = 0.0
        p.text = f"no overlap ({why})"
        p.sections[:0] = list(sections)

    if kind == "none":
        none_("no fault", P1)
    elif kind == "pause-holder":
        if not lease:
            none_("the kernel holds a file lock as long as dlock lives, stopped or not",
                  "The file backend (\"No lease, no expiry\")")
        elif pause_s is not None and pause_s <= safe_pause_s(ttl_s):
            none_(f"dlock paused {pause_s:g} s <= TTL - TTL/3 - margin = "
                  f"{safe_pause_s(ttl_s):.2f} s: stopped before the lease can run out", P1)
        else:
            p.max_overlap_ms = None
            what = f"{pause_s:g} s" if pause_s is not None else "for an unknown time"
            p.text = (f"overlap allowed: dlock itself paused {what} (> {safe_pause_s(ttl_s):.2f} s"
                      f" margin), which promise 1 cannot help; tokens must protect")
            p.sections.insert(0, P1 + ", \"This cannot help when dlock itself is paused\"")
    elif kind == "crash-holder":
        none_("a killed dlock's command gets SIGKILL from the kernel", P1,
              "The command's children (\"If dlock is killed with SIGKILL\")")
        if backend in ("file", "postgres", "mysql"):
            p.recovery_ms = SLACK_S * 1000.0
            p.recovery_text = "freed at once (the kernel closes the lock/connection)"
            p.sections.append({"file": "The file backend", "postgres": "PostgreSQL",
                               "mysql": "MySQL and MariaDB"}[backend] + " (\"A crashed holder\")")
        else:
            extra = 0.5 if backend == "etcd" else 0.0
            p.recovery_ms = (ttl_s + extra + SLACK_S) * 1000.0
            p.recovery_text = f"a crashed holder blocks others at most the TTL ({ttl_s:g} s)" + (
                " + etcd's 500 ms expiry check" if extra else "") + " after its last renewal"
            section = {"etcd": "etcd", "zookeeper": "ZooKeeper"}.get(backend, "Redis")
            p.sections.append(f"{section} (\"A crashed holder\")")
    elif kind == "clock":
        none_("dlock's deadlines are on CLOCK_BOOTTIME; a client's wall clock moves no deadline", P1)
    elif kind == "wipe":
        p.max_overlap_ms = _failover_bound(ttl_s, kill_after_s)
        p.text = ("overlap <= TTL/3 + 1 s + --kill-after: event-based loss (a restart without "
                  "the data) is noticed at the next renewal")
        p.sections[:0] = [P2 + " (event-based loss)",
                          "memcached (\"Eviction, a restart\")" if backend == "memcached"
                          else "Redis (\"Event-based loss\")"]
    elif kind == "client-net":
        none_("only the holder's host is cut: it cannot renew and is stopped before the lease "
              "can expire; no server fails over", P1)
    else:  # server-net, server-pause, server-crash
        if backend == "file":
            none_("no server", "The file backend")
        elif backend in ("etcd", "zookeeper"):
            none_("a member down keeps holds while a quorum remains; without one the command is "
                  "stopped before the lease could expire", P1,
                  "etcd (\"A cluster member going down\")" if backend == "etcd"
                  else "ZooKeeper (\"An ensemble member going down\")")
        elif failover and replicas and backend == "redis-sentinel":
            none_("?replicas=N: a hold survives a failover to a replica that acknowledged it",
                  "Redis (\"One server, no failover\"), Redis behind Sentinel")
        elif failover:
            p.max_overlap_ms = _failover_bound(ttl_s, kill_after_s)
            p.text = ("overlap <= TTL/3 + 1 s + --kill-after: asynchronous replication, a "
                      "failover can lose a hold")
            p.sections[:0] = ["Redis (\"One server, no failover\" / \"Redis Cluster\")"]
        elif kind == "server-crash" and backend in ("redis", "memcached"):
            p.max_overlap_ms = _failover_bound(ttl_s, kill_after_s)
            p.text = ("overlap <= TTL/3 + 1 s + --kill-after: a restart can lose the hold "
                      "(event-based loss), noticed at the next renewal")
            p.sections[:0] = ["memcached (\"Eviction, a restart\")" if backend == "memcached"
                              else "Redis (\"Event-based loss\")"]
        elif kind == "server-crash" and backend == "postgres":
            p.max_overlap_ms = _failover_bound(ttl_s, kill_after_s)
            p.text = ("overlap <= TTL/3 + 1 s + --kill-after: a restart ends the session, "
                      "noticed at once or at the next heartbeat (TTL/3)")
            p.sections[:0] = ["PostgreSQL (\"Overlap after a server-side disconnect\")"]
        elif kind == "server-crash" and backend == "mysql":
            p.max_overlap_ms = (ttl_s + kill_after_s) * 1000.0
            p.text = ("overlap <= TTL + --kill-after: a session the server ends is noticed by "
                      "the watcher at once, at worst by the lease's deadline within the TTL")
            p.sections[:0] = ["MySQL and MariaDB (\"GET_LOCK has no lease\")"]
        else:
            none_("a holder that cannot renew is stopped before its lease/session can expire",
                  P1)
    return p
