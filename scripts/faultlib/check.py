"""The checker of scripts/faults: reads only what the run wrote (history.jsonl, fencing.jsonl,
phases.jsonl, and nemesis.jsonl for the heal times and the holders a nemesis SIGKILLed,
whose CS ended with their dlock: PR_SET_PDEATHSIG) and makes one cell per backend x nemesis,
each held to its promise (promises.py). Writes results.json and prints a short table.

    python3 scripts/faultlib/check.py OUT_DIR      # re-check a finished run; exit 1 if broken

Per cell: cs (critical sections entered), overlaps (pairs of CS of one name whose
[enter_ns, exit_ns] intersect) and max_overlap_ms, stale_refused / stale_accepted (fencing
accesses refused / accepted with a token lower than one accepted before for the name: must be
0), duplicate_tokens (two CS of one name with one token), tokens_backwards (a CS that began
after another of its name had ended, with a token not larger), exits {rc: count} (runs the
harness cancelled at the phase's end are counted apart), unavailable_ms (after the fault
healed: the longest time a name was wanted, a run of it waiting, while no CS of it ran),
hung, and the promise with its measured worst case; promise_broken is false or what broke.
"""

import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from faultlib import promises  # noqa: E402
else:
    from . import promises


def load_jsonl(path: str) -> list[dict]:
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a line cut by a crash: ignored, the rest still counts
    except OSError:
        pass
    return out


def overlaps(cs: list[dict]) -> tuple[int, float, list[dict]]:
    """Pairs of one name's critical sections that were inside at once: (count, longest ms,
    up to 10 examples)."""
    count, longest, examples = 0, 0.0, []
    by_name: dict[str, list[dict]] = {}
    for c in cs:
        by_name.setdefault(c["name"], []).append(c)
    for items in by_name.values():
        items.sort(key=lambda c: c["enter_ns"])
        active: list[dict] = []
        for b in items:
            active = [a for a in active if a["exit_ns"] > b["enter_ns"]]
            for a in active:
                ms = (min(a["exit_ns"], b["exit_ns"]) - b["enter_ns"]) / 1e6
                count += 1
                longest = max(longest, ms)
                if len(examples) < 10:
                    examples.append({"name": b["name"], "ms": round(ms, 1),
                                     "a": _brief(a), "b": _brief(b)})
            active.append(b)
    return count, longest, examples


def _brief(c: dict) -> dict:
    return {k: c.get(k) for k in ("host", "pid", "token", "enter_ns", "exit_ns", "rc",
                                  "exit_by", "fence_enter", "fence_exit", "run")}


def token_order(cs: list[dict]) -> tuple[int, int, list[dict]]:
    """(duplicate tokens, tokens not increasing after an earlier CS had ended, examples)."""
    dups, backwards, examples = 0, 0, []
    by_name: dict[str, list[dict]] = {}
    for c in cs:
        if c.get("token") is not None:
            by_name.setdefault(c["name"], []).append(c)
    for items in by_name.values():
        seen: dict[int, dict] = {}
        for c in items:
            other = seen.get(c["token"])
            if other is not None and other.get("run") != c.get("run"):
                dups += 1
                if len(examples) < 10:
                    examples.append({"duplicate": c["token"], "a": _brief(other), "b": _brief(c)})
            seen.setdefault(c["token"], c)
        by_exit = sorted(items, key=lambda c: c["exit_ns"])
        by_enter = sorted(items, key=lambda c: c["enter_ns"])
        i, top, top_c = 0, None, None
        for b in by_enter:
            while i < len(by_exit) and by_exit[i]["exit_ns"] <= b["enter_ns"]:
                if top is None or by_exit[i]["token"] > top:
                    top, top_c = by_exit[i]["token"], by_exit[i]
                i += 1
            if top is not None and b["token"] <= top and top_c.get("run") != b.get("run"):
                backwards += 1
                if len(examples) < 10:
                    examples.append({"not_increasing": b["token"], "after": _brief(top_c),
                                     "b": _brief(b)})
    return dups, backwards, examples


def stale_accepted(fencing: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Accesses the resource accepted with a token lower than one it had accepted before for
    the (backend, name): recomputed from fencing.jsonl, keyed by (backend, nemesis)."""
    out: dict[tuple[str, str], list[dict]] = {}
    top: dict[tuple[str, str], int] = {}
    for line in sorted(fencing, key=lambda x: x.get("at_ns", 0)):
        if not line.get("accepted") or line.get("token") is None:
            continue
        key = (line.get("backend"), line.get("name"))
        prev = top.get(key)
        if prev is not None and line["token"] < prev:
            out.setdefault((line.get("backend"), line.get("nemesis")), []).append(line)
        else:
            top[key] = line["token"]
    return out


def unavailable(runs: list[dict], names: list[str], healed_ns: int, end_ns: int):
    """Longest time (ms) after healed_ns in which a name was wanted (a run of it had started
    and not yet ended) and not held (no CS of it running), and the names wanted after the heal
    that had no CS at all after it."""
    worst, never = 0.0, []
    for name in names:
        mine = [r for r in runs if r["name"] == name and r.get("start_ns") is not None]
        cs = sorted((r["enter_ns"], r["exit_ns"]) for r in mine
                    if r.get("enter_ns") is not None and r.get("exit_ns") is not None
                    and r["exit_ns"] > healed_ns)
        # Gaps between holds, from the heal to the phase's end.
        gaps, t = [], healed_ns
        for enter, exit_ in cs:
            if enter > t:
                gaps.append((t, enter, True))
            t = max(t, exit_)
        if t < end_ns:
            gaps.append((t, end_ns, False))
        def wait_end(r):
            """A run wants the name from its start until it enters (or gives up)."""
            return r["enter_ns"] if r.get("enter_ns") is not None else (r.get("end_ns") or end_ns)

        for g0, g1, closed in gaps:
            waiting = [r for r in mine if r["start_ns"] < g1 and wait_end(r) > g0]
            if not waiting:
                continue
            if not closed:
                # An open gap counts until the last run that wanted the name gave up.
                g1 = min(end_ns, max(wait_end(r) for r in waiting))
            worst = max(worst, (g1 - min(max(r["start_ns"], g0) for r in waiting)) / 1e6)
        wanted_after = any(wait_end(r) > healed_ns for r in mine)
        if wanted_after and not any(enter >= healed_ns or exit_ > healed_ns
                                    for enter, exit_ in cs):
            never.append(name)
    return worst, never


def killed_holders(nemesis_lines: list[dict]) -> dict[tuple[str, str, int], int]:
    """(backend, nemesis, dlock pid) -> when a nemesis SIGKILLed that holding dlock: its
    command died with it (PR_SET_PDEATHSIG), so its CS ended then, not when the client saw
    dlock's exit."""
    out = {}
    for line in nemesis_lines:
        if line.get("event") == "fault" and "SIGKILL" in str(line.get("detail", "")) \
                and isinstance(line.get("dlock_pid"), int) and isinstance(line.get("at_ns"), int):
            out[(line.get("backend"), line.get("nemesis"), line["dlock_pid"])] = line["at_ns"]
    return out


def heal_times(nemesis_lines: list[dict]) -> dict[tuple[str, str], int]:
    out = {}
    for line in nemesis_lines:
        if line.get("event") == "healed" and isinstance(line.get("at_ns"), int):
            out[(line.get("backend"), line.get("nemesis"))] = line["at_ns"]
    return out


def make_cell(phase: dict, runs: list[dict], fencing: list[dict], stale_acc: list[dict],
              healed_ns: int) -> dict:
    backend, nemesis = phase["backend"], phase["nemesis"]
    ttl_s, kill_after_s, wait_s = phase["ttl_s"], phase["kill_after_s"], phase["wait_s"]
    promise = promises.promise_for(
        backend, nemesis, ttl_s=ttl_s, kill_after_s=kill_after_s, wait_s=wait_s,
        url=phase.get("url", ""), pause_s=phase.get("pause_s"),
        holder_net=bool(phase.get("holder_net")))
    cs = [r for r in runs if r.get("enter_ns") is not None and r.get("exit_ns") is not None]
    n_over, max_over, over_examples = overlaps(cs)
    dups, backwards, token_examples = token_order(cs)
    exits: dict[str, int] = {}
    cancelled = 0
    for r in runs:
        if r.get("cancelled") and r.get("enter_ns") is None:
            cancelled += 1
            continue
        key = str(r.get("rc"))
        exits[key] = exits.get(key, 0) + 1
    hung = sum(1 for r in runs if r.get("hung"))
    refused = sum(1 for f in fencing if not f.get("accepted"))
    fence_errors = sum(1 for r in cs if str(r.get("fence_enter") or "").startswith("error"))
    names = phase.get("names") or sorted({r["name"] for r in runs})
    end_ns = phase.get("end_ns") or max([r.get("end_ns") or 0 for r in runs] + [healed_ns])
    unavail_ms, never = unavailable(runs, names, healed_ns, end_ns)
    waits = [(r["end_ns"] - r["start_ns"]) / 1e6 for r in runs
             if r.get("enter_ns") is None and not r.get("cancelled") and not r.get("hung")
             and r.get("end_ns") and r.get("start_ns")]
    max_wait_ms = max(waits) if waits else 0.0

    broken = []
    if stale_acc:
        broken.append(f"{len(stale_acc)} stale token(s) accepted by the fencing resource")
    if dups:
        broken.append(f"{dups} duplicate token(s)")
    if backwards:
        broken.append(f"{backwards} token(s) not larger than an earlier finished CS's")
    if hung:
        broken.append(f"{hung} hung run(s) (> {phase.get('hung_bound_s', 0):.0f} s)")
    if promise.max_overlap_ms is not None and n_over > 0 and max_over > promise.max_overlap_ms:
        broken.append(f"overlap {max_over:.0f} ms > {promise.max_overlap_ms:.0f} ms allowed "
                      f"({n_over} pair(s))")
    if promise.recovery_ms is not None and unavail_ms > promise.recovery_ms:
        broken.append(f"unavailable {unavail_ms:.0f} ms after the heal > "
                      f"{promise.recovery_ms:.0f} ms ({promise.recovery_text})")
    if never:
        broken.append(f"liveness (harness expectation): no CS of {', '.join(never)} in the "
                      f"{(end_ns - healed_ns) / 1e9:.1f} s after the heal")
    if promise.wait_bound_ms is not None and max_wait_ms > promise.wait_bound_ms:
        broken.append(f"a run that never entered took {max_wait_ms:.0f} ms > --wait bound "
                      f"{promise.wait_bound_ms:.0f} ms")
    if phase.get("error"):
        broken.append(f"harness: {phase['error']}")
    if not cs and not phase.get("error"):
        broken.append("no critical section at all")

    measured = (f"max overlap {max_over:.0f} ms ({n_over} pairs); stale accepted "
                f"{len(stale_acc)}; tokens dup/backwards {dups}/{backwards}; unavailable "
                f"{unavail_ms:.0f} ms after heal; hung {hung}")
    return {
        "backend": backend, "nemesis": nemesis, "cs": len(cs), "overlaps": n_over,
        "max_overlap_ms": round(max_over, 1), "stale_refused": refused,
        "stale_accepted": len(stale_acc), "duplicate_tokens": dups,
        "tokens_backwards": backwards, "exits": dict(sorted(exits.items())),
        "cancelled_at_end": cancelled, "unavailable_ms": round(unavail_ms, 1),
        "never_recovered": never, "hung": hung, "fence_unreachable": fence_errors,
        "max_wait_ms": round(max_wait_ms, 1),
        "promise": promise.text, "promise_detail": promise.as_dict(), "measured": measured,
        "promise_broken": "; ".join(broken) if broken else False,
        "overlap_examples": over_examples, "token_examples": token_examples,
        "stale_accepted_examples": stale_acc[:5],
        "ttl_s": ttl_s, "kill_after_s": kill_after_s, "wait_s": wait_s,
        "healed_after_start_ms": round((healed_ns - phase.get("start_ns", healed_ns)) / 1e6, 1),
    }


def check(out_dir: str) -> dict:
    phases = load_jsonl(os.path.join(out_dir, "phases.jsonl"))
    history = load_jsonl(os.path.join(out_dir, "history.jsonl"))
    fencing = load_jsonl(os.path.join(out_dir, "fencing.jsonl"))
    nemesis_lines = load_jsonl(os.path.join(out_dir, "nemesis.jsonl"))
    heals = heal_times(nemesis_lines)
    for (backend, nemesis, pid), at in killed_holders(nemesis_lines).items():
        for r in history:
            if (r.get("backend"), r.get("nemesis"), r.get("pid")) == (backend, nemesis, pid) \
                    and r.get("exit_by") == "dlock-exit" and r.get("enter_ns") is not None:
                r["exit_ns"] = max(r["enter_ns"], min(r["exit_ns"], at))
                r["exit_by"] = "killed-with-dlock"
    stale = stale_accepted(fencing)
    cells = []
    for phase in phases:
        key = (phase["backend"], phase["nemesis"])
        runs = [r for r in history if (r.get("backend"), r.get("nemesis")) == key]
        fence = [f for f in fencing if (f.get("backend"), f.get("nemesis")) == key]
        healed = heals.get(key) or phase.get("healed_ns") or phase.get("start_ns") or 0
        cells.append(make_cell(phase, runs, fence, stale.get(key, []), healed))
    # A stale token accepted in a cell no phase names still breaks the run.
    orphans = [k for k in stale if k not in {(p["backend"], p["nemesis"]) for p in phases}]
    return {"cells": cells, "orphan_stale_accepted": [list(k) for k in orphans]}


def table(results: dict) -> str:
    head = ["backend", "nemesis", "cs", "overl", "max_ov_ms", "bound_ms", "stale_ref",
            "stale_acc", "exits", "unavail_ms", "hung", "verdict"]
    rows = [head]
    for c in results["cells"]:
        bound = c["promise_detail"]["max_overlap_ms"]
        rows.append([
            c["backend"], c["nemesis"], str(c["cs"]), str(c["overlaps"]),
            f"{c['max_overlap_ms']:.0f}", "-" if bound is None else f"{bound:.0f}",
            str(c["stale_refused"]), str(c["stale_accepted"]),
            " ".join(f"{k}:{v}" for k, v in c["exits"].items()),
            f"{c['unavailable_ms']:.0f}", str(c["hung"]),
            "ok" if not c["promise_broken"] else "BROKEN",
        ])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    for c in results["cells"]:
        if c["promise_broken"]:
            lines.append(f"BROKEN {c['backend']} / {c['nemesis']}: {c['promise_broken']}")
            lines.append(f"   promise: {c['promise']}")
    return "\n".join(lines)


def markdown(results: dict) -> str:
    """The table of docs/guarantees.md's "Measured under faults": a row per cell."""
    lines = ["| backend | nemesis | CS | overlaps (longest) | allowed | stale refused / accepted "
             "| exits | unavailable after heal | hung | |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in results["cells"]:
        bound = c["promise_detail"]["max_overlap_ms"]
        allowed = "any (tokens)" if bound is None else "none" if bound == 0 else f"{bound:.0f} ms"
        exits = " ".join(f"{k}:{v}" for k, v in c["exits"].items())
        verdict = "ok" if not c["promise_broken"] else f"**broken**: {c['promise_broken']}"
        lines.append(f"| {c['backend']} | {c['nemesis']} | {c['cs']} | {c['overlaps']} "
                     f"({c['max_overlap_ms']:.0f} ms) | {allowed} | {c['stale_refused']} / "
                     f"{c['stale_accepted']} | {exits} | {c['unavailable_ms']:.0f} ms | "
                     f"{c['hung']} | {verdict} |")
    return "\n".join(lines)


def broken(results: dict) -> bool:
    return bool(results.get("orphan_stale_accepted")) or any(
        c["promise_broken"] for c in results["cells"])


def write(out_dir: str, results: dict):
    tmp = os.path.join(out_dir, "results.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out_dir, "results.json"))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    as_markdown = argv[:1] == ["--markdown"]
    argv = argv[1:] if as_markdown else argv
    if len(argv) != 1:
        print("usage: check.py [--markdown] OUT_DIR", file=sys.stderr)
        return 64
    results = check(argv[0])
    try:  # what the harness recorded about the run itself stays
        with open(os.path.join(argv[0], "results.json"), encoding="utf-8") as f:
            before = json.load(f)
        results.update({k: before[k] for k in ("command", "date", "seconds") if k in before})
    except (OSError, ValueError):
        pass
    write(argv[0], results)
    print(markdown(results) if as_markdown else table(results))
    return 1 if broken(results) else 0


if __name__ == "__main__":
    sys.exit(main())
