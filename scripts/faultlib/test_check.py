"""Unit tests of the checker on hand-made histories:
python3 -m unittest scripts/faultlib/test_check.py (from the repo root)."""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from faultlib import check, promises  # noqa: E402

S = 1_000_000_000
MS = 1_000_000


def run(name, token, enter_s, exit_s, rc=0, host="c1", pid=100, **kw):
    line = {"backend": "etcd", "nemesis": "isolate-holder", "name": name, "host": host,
            "pid": pid, "token": token,
            "enter_ns": None if enter_s is None else int(enter_s * S),
            "exit_ns": None if exit_s is None else int(exit_s * S), "rc": rc,
            "mode": "exclusive", "run": f"{host}-{pid}-{token}",
            # An entered run waited 10 ms and released in 10 ms; a run that never entered
            # spans exactly start_s..end_s.
            "start_ns": int((enter_s - 0.01 if enter_s is not None else kw.get("start_s", 0)) * S),
            "end_ns": int((exit_s + 0.01 if exit_s is not None else kw.get("end_s", 0)) * S),
            "hung": kw.get("hung", False), "cancelled": kw.get("cancelled", False),
            "fence_enter": "ok 1"}
    return line


def fence(name, token, at_s, accepted, nemesis="isolate-holder"):
    return {"backend": "etcd", "nemesis": nemesis, "name": name, "token": token,
            "accepted": accepted, "at_ns": int(at_s * S), "host": "c1", "pid": 1}


def phase(nemesis="isolate-holder", healed_s=10.0, end_s=20.0, **kw):
    p = {"backend": "etcd", "nemesis": nemesis, "ttl_s": 3.0, "kill_after_s": 1.0,
         "wait_s": 5.0, "hung_bound_s": 25.0, "start_ns": 0, "fault_ns": 5 * S,
         "healed_ns": int(healed_s * S), "end_ns": int(end_s * S), "names": ["n0"], "url": ""}
    p.update(kw)
    return p


class Checker(unittest.TestCase):
    def write(self, d, phases, history, fencing=(), nemesis=()):
        for fname, lines in (("phases.jsonl", phases), ("history.jsonl", history),
                             ("fencing.jsonl", fencing), ("nemesis.jsonl", nemesis)):
            with open(os.path.join(d, fname), "w") as f:
                for line in lines:
                    f.write(json.dumps(line) + "\n")

    def check(self, phases, history, fencing=(), nemesis=()):
        with tempfile.TemporaryDirectory() as d:
            self.write(d, phases, history, fencing, nemesis)
            return check.check(d)

    def steady(self, start=10.0, n=20, step=0.5):
        """n one-after-another CS of n0 from `start`, 0.1 s each, increasing tokens."""
        return [run("n0", 100 + 10 * i, start + i * step, start + i * step + 0.1, pid=200 + i)
                for i in range(n)]

    def test_a_clean_history_breaks_nothing(self):
        r = self.check([phase()], self.steady())
        cell = r["cells"][0]
        self.assertEqual(cell["cs"], 20)
        self.assertEqual(cell["overlaps"], 0)
        self.assertFalse(cell["promise_broken"])
        self.assertFalse(check.broken(r))

    def test_an_overlap_is_found_and_its_length_measured(self):
        # Tokens of the steady CS: 100, 110, ...; the intruder's (145) fits between.
        history = self.steady() + [run("n0", 145, 12.05, 12.3, host="c2", pid=999)]
        cell = self.check([phase()], history)["cells"][0]
        # [12.05, 12.3] meets [12.0, 12.1] for 50 ms and [12.5 ...] not at all.
        self.assertEqual(cell["overlaps"], 1)
        self.assertAlmostEqual(cell["max_overlap_ms"], 50.0, delta=0.5)
        self.assertIn("overlap 50 ms > 0 ms allowed", cell["promise_broken"])
        self.assertEqual(cell["overlap_examples"][0]["b"]["pid"], 999)

    def test_an_overlap_within_a_stated_bound_breaks_nothing(self):
        # redis-sentinel under a server fault: TTL/3 + 1 s + kill-after = 3 s allowed.
        ph = phase(nemesis="crash-leader", backend="redis-sentinel")
        history = [dict(h, backend="redis-sentinel", nemesis="crash-leader")
                   for h in self.steady(start=15) + [run("n0", 1, 10.0, 12.0, pid=998),
                                                     run("n0", 2, 10.4, 12.5, pid=999)]]
        cell = self.check([ph], history)["cells"][0]
        self.assertGreater(cell["overlaps"], 0)
        self.assertAlmostEqual(cell["max_overlap_ms"], 1600.0, delta=1)
        self.assertEqual(cell["promise_detail"]["max_overlap_ms"], 3000.0)
        self.assertFalse(cell["promise_broken"])

    def test_a_stale_token_accepted_breaks_every_cell_it_happens_in(self):
        phases = [phase(nemesis="none"), phase()]
        history = ([dict(h, nemesis="none") for h in self.steady()] + self.steady(start=30))
        fencing = [fence("n0", 2000, 1.0, True, nemesis="none"),
                   fence("n0", 150, 31.0, True),   # lower than 2000, accepted: broken
                   fence("n0", 120, 32.0, False)]  # refused: what the resource is for
        r = self.check(phases, history, fencing)
        none, faulted = r["cells"]
        self.assertFalse(none["promise_broken"])
        self.assertEqual(faulted["stale_accepted"], 1)
        self.assertEqual(faulted["stale_refused"], 1)
        self.assertIn("stale token(s) accepted", faulted["promise_broken"])
        self.assertTrue(check.broken(r))

    def test_a_stale_token_accepted_breaks_even_where_overlap_is_allowed(self):
        ph = phase(nemesis="pause-holder-long", pause_s=6.0)
        history = [dict(h, nemesis="pause-holder-long") for h in self.steady()]
        fencing = [fence("n0", 200, 11.0, True, nemesis="pause-holder-long"),
                   fence("n0", 199, 12.0, True, nemesis="pause-holder-long")]
        cell = self.check([ph], history, fencing)["cells"][0]
        self.assertIsNone(cell["promise_detail"]["max_overlap_ms"])
        self.assertIn("stale token(s) accepted", cell["promise_broken"])

    def test_tokens_that_do_not_increase_break_the_cell(self):
        history = self.steady()
        history[5]["token"] = history[4]["token"]  # one token for two CS
        cell = self.check([phase()], history)["cells"][0]
        self.assertEqual(cell["duplicate_tokens"], 1)
        self.assertIn("duplicate token", cell["promise_broken"])

    def test_hung_runs_break_the_cell(self):
        history = self.steady() + [run("n0", None, None, None, rc=137, hung=True,
                                       start_s=11, end_s=40)]
        cell = self.check([phase()], history)["cells"][0]
        self.assertEqual(cell["hung"], 1)
        self.assertEqual(cell["exits"], {"0": 20, "137": 1})
        self.assertIn("1 hung run(s)", cell["promise_broken"])

    def test_unavailability_after_the_heal_is_measured(self):
        # Healed at 10 s; the name is taken again only at 12.5 s, then steadily.
        waiter = run("n0", None, None, None, rc=75, start_s=9.0, end_s=12.4)
        history = [run("n0", 1, 4.0, 4.1), waiter] + self.steady(start=12.5, n=10)
        cell = self.check([phase(healed_s=10.0)], history)["cells"][0]
        self.assertAlmostEqual(cell["unavailable_ms"], 2500.0, delta=1)
        # isolate-holder states no recovery bound: measured, not a broken promise.
        self.assertFalse(cell["promise_broken"])

    def test_the_heal_time_comes_from_nemesis_jsonl_when_it_is_there(self):
        waiter = run("n0", None, None, None, rc=75, start_s=9.0, end_s=12.4)
        history = [waiter] + self.steady(start=12.5, n=10)
        nem = [{"backend": "etcd", "nemesis": "isolate-holder", "event": "healed",
                "at_ns": 12 * S}]
        cell = self.check([phase(healed_s=10.0)], history, nemesis=nem)["cells"][0]
        self.assertAlmostEqual(cell["unavailable_ms"], 500.0, delta=1)

    def test_unavailability_beyond_a_documented_recovery_bound_breaks_the_cell(self):
        # crash-holder on etcd: TTL 3 s + 0.5 s + 3 s slack = 6.5 s.
        ph = phase(nemesis="crash-holder", healed_s=10.0, end_s=30.0)
        waiter = run("n0", None, None, None, rc=75, start_s=9.0, end_s=17.9)
        history = [dict(h, nemesis="crash-holder") for h in [waiter] + self.steady(start=18.0, n=10)]
        cell = self.check([ph], history)["cells"][0]
        self.assertAlmostEqual(cell["unavailable_ms"], 8000.0, delta=1)
        self.assertIn("unavailable 8000 ms after the heal > 6500 ms", cell["promise_broken"])

    def test_a_name_never_taken_after_the_heal_breaks_liveness(self):
        waiter = run("n0", None, None, None, rc=75, start_s=11.0, end_s=19.0)
        history = [run("n0", 1, 4.0, 4.1), waiter]
        cell = self.check([phase()], history)["cells"][0]
        self.assertEqual(cell["never_recovered"], ["n0"])
        self.assertAlmostEqual(cell["unavailable_ms"], 8000.0, delta=1)
        self.assertIn("liveness", cell["promise_broken"])

    def test_a_name_nobody_wanted_is_not_unavailable(self):
        history = [run("n0", 1, 4.0, 4.1), run("n0", 2, 15.0, 15.1)]
        cell = self.check([phase()], history)["cells"][0]
        # Only the 10 ms the second run itself waited.
        self.assertAlmostEqual(cell["unavailable_ms"], 10.0, delta=0.5)
        self.assertEqual(cell["never_recovered"], [])

    def test_a_holder_killed_by_the_nemesis_ended_when_it_was_killed(self):
        # The client saw dlock's exit at 12.3 s, the nemesis killed it at 12.0 s; the next
        # holder entered at 12.1 s: no overlap.
        ph = phase(nemesis="crash-holder")
        killed = dict(run("n0", 100, 11.0, 12.3, rc=137, pid=777, exit_by="dlock-exit"),
                      nemesis="crash-holder", exit_by="dlock-exit")
        nxt = dict(run("n0", 110, 12.1, 12.2, pid=778), nemesis="crash-holder")
        nem = [{"backend": "etcd", "nemesis": "crash-holder", "event": "fault",
                "at_ns": 12 * S, "detail": "SIGKILL holder dlock 777", "dlock_pid": 777}]
        cell = self.check([ph], [killed, nxt], nemesis=nem)["cells"][0]
        self.assertEqual(cell["overlaps"], 0)

    def test_runs_cancelled_at_the_end_are_not_exits(self):
        history = self.steady() + [run("n0", None, None, None, rc=143, cancelled=True,
                                       start_s=19, end_s=20)]
        cell = self.check([phase()], history)["cells"][0]
        self.assertEqual(cell["exits"], {"0": 20})
        self.assertEqual(cell["cancelled_at_end"], 1)
        self.assertFalse(cell["promise_broken"])

    def test_the_table_names_what_broke(self):
        history = self.steady() + [run("n0", 145, 12.05, 12.3, pid=999)]
        r = self.check([phase()], history)
        text = check.table(r)
        self.assertIn("BROKEN etcd / isolate-holder: overlap", text)

    def test_the_markdown_table_has_a_row_per_cell_with_its_bound_and_verdict(self):
        clean = self.check([phase()], self.steady())
        rows = check.markdown(clean).splitlines()
        self.assertEqual(len(rows), 3)
        self.assertTrue(rows[2].startswith("| etcd | isolate-holder | 20 | 0 (0 ms) | none |"))
        self.assertTrue(rows[2].endswith("| ok |"))
        history = self.steady() + [run("n0", 145, 12.05, 12.3, pid=999)]
        broken_row = check.markdown(self.check([phase()], history)).splitlines()[2]
        self.assertIn("| 1 (", broken_row)
        self.assertIn("**broken**: overlap", broken_row)


class Promises(unittest.TestCase):
    def test_a_short_pause_of_the_holder_promises_no_overlap_and_a_long_one_does_not(self):
        short = promises.promise_for("etcd", "pause-holder-short", ttl_s=3, kill_after_s=1,
                                     wait_s=5, pause_s=1.0)
        long = promises.promise_for("etcd", "pause-holder-long", ttl_s=3, kill_after_s=1,
                                    wait_s=5, pause_s=6.0)
        self.assertEqual(short.max_overlap_ms, 0.0)
        self.assertIsNone(long.max_overlap_ms)

    def test_sentinel_failover_bound_is_ttl_third_plus_one_plus_kill_after(self):
        p = promises.promise_for("redis-sentinel", "crash-leader", ttl_s=3, kill_after_s=1,
                                 wait_s=5)
        self.assertEqual(p.max_overlap_ms, 3000.0)
        with_replicas = promises.promise_for("redis-sentinel", "crash-leader", ttl_s=3,
                                             kill_after_s=1, wait_s=5,
                                             url="redis-sentinel://a#m?replicas=1")
        self.assertEqual(with_replicas.max_overlap_ms, 0.0)

    def test_every_promise_cites_a_section(self):
        for backend in ("file", "redis", "redis-sentinel", "redis-cluster", "etcd",
                        "zookeeper", "postgres", "mysql", "memcached"):
            for nemesis in ("none", "isolate-node", "majority-minority", "isolate-holder",
                            "one-way", "flapping", "loss", "pause-leader", "pause-holder",
                            "crash-leader", "crash-wipe", "crash-holder", "clock-skew",
                            "clock-step"):
                p = promises.promise_for(backend, nemesis, ttl_s=3, kill_after_s=1, wait_s=5)
                self.assertTrue(p.sections and p.text, (backend, nemesis))


if __name__ == "__main__":
    unittest.main()
