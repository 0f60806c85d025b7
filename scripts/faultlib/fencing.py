"""The fencing resource: a small TCP server that records every access with the fencing token
it carries and refuses a token lower than the highest it has accepted for that lock name.

It stands for the resource a lock protects (guarantees.md, promise 2): a client in a
critical section sends one line

    ACCESS <backend> <nemesis> <name> <token> <host> <pid> [<what>]\\n

and gets back `OK <max>` (accepted; <max> is the new highest token of the name) or
`STALE <max>` (refused: a newer holder has been here). Anything else gets `BAD <reason>`.
The highest token is kept per (backend, name), across nemeses: tokens must never go
backwards on the resource, whatever happened in between.

Every access is one JSON line in the output file (fencing.jsonl):
{backend, nemesis, name, token, accepted, at_ns, host, pid, max_before, what}; at_ns is
CLOCK_BOOTTIME, the one clock of every host of the harness.

Standalone:  python3 fencing.py --listen ADDR:PORT --out fencing.jsonl [--ready FILE]
It writes "ready ADDR:PORT" to --ready once listening, and stops on SIGTERM/SIGINT, on
--max-seconds, or (in tests) when serve() is told to stop. Each connection is bounded by a
read timeout and a line-length cap.
"""

import argparse
import json
import os
import signal
import socket
import socketserver
import sys
import threading
import time

MAX_LINE = 4096
CONN_TIMEOUT_S = 5.0
MAX_LINES_PER_CONN = 1000


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


class Resource:
    """The state: highest accepted token per (backend, name), and the access log."""

    def __init__(self, out_path: str):
        self.lock = threading.Lock()
        self.max: dict[tuple[str, str], int] = {}
        self.out = open(out_path, "a", encoding="utf-8")

    def access(self, backend, nemesis, name, token, host, pid, what) -> tuple[bool, int]:
        with self.lock:
            key = (backend, name)
            before = self.max.get(key)
            accepted = before is None or token >= before
            if accepted:
                self.max[key] = token
            line = {
                "backend": backend, "nemesis": nemesis, "name": name, "token": token,
                "accepted": accepted, "at_ns": now_ns(), "host": host, "pid": pid,
                "max_before": before, "what": what,
            }
            self.out.write(json.dumps(line) + "\n")
            self.out.flush()
            return accepted, self.max[key]

    def close(self):
        with self.lock:
            self.out.close()


def answer(resource: Resource, line: str) -> str:
    parts = line.split()
    if len(parts) not in (7, 8) or parts[0] != "ACCESS":
        return "BAD expected: ACCESS backend nemesis name token host pid [what]"
    _, backend, nemesis, name, token_s, host, pid_s = parts[:7]
    what = parts[7] if len(parts) == 8 else "access"
    try:
        token = int(token_s)
        pid = int(pid_s)
    except ValueError:
        return f"BAD token and pid must be integers: {token_s!r} {pid_s!r}"
    accepted, top = resource.access(backend, nemesis, name, token, host, pid, what)
    return f"{'OK' if accepted else 'STALE'} {top}"


class Handler(socketserver.StreamRequestHandler):
    timeout = CONN_TIMEOUT_S

    def handle(self):
        for _ in range(MAX_LINES_PER_CONN):
            try:
                raw = self.rfile.readline(MAX_LINE)
            except (OSError, socket.timeout):
                return
            if not raw:
                return
            reply = answer(self.server.resource, raw.decode("utf-8", "replace"))
            try:
                self.wfile.write((reply + "\n").encode())
                self.wfile.flush()
            except OSError:
                return


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], resource: Resource):
        self.resource = resource
        super().__init__(addr, Handler)


def parse_listen(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    return host or "0.0.0.0", int(port)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="the fencing resource of scripts/faults")
    p.add_argument("--listen", required=True, help="ADDR:PORT (PORT 0: any free port)")
    p.add_argument("--out", required=True, help="fencing.jsonl to append to")
    p.add_argument("--ready", help="file to write 'ready ADDR:PORT' to once listening")
    p.add_argument("--max-seconds", type=float, default=6 * 3600.0,
                   help="stop after this long whatever happens (a bound, default 6 h)")
    a = p.parse_args(argv)
    resource = Resource(a.out)
    server = Server(parse_listen(a.listen), resource)
    stop = threading.Event()

    def on_signal(_sig, _frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    if a.ready:
        tmp = a.ready + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"ready {host}:{port}\n")
        os.replace(tmp, a.ready)
    print(f"fencing: ready {host}:{port}", flush=True)
    stop.wait(a.max_seconds)
    server.shutdown()
    server.server_close()
    resource.close()
    print("fencing: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
