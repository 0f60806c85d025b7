//! Where a hand-off's time goes: P `dlock run` loops contend for one lock, each
//! run's command a ~1 ms `sleep`, with the hand-off events on (`DLOCK_LOG=dlock::handoff=debug`,
//! docs/performance.md: "Where a hand-off's time goes"). All processes' events are merged by their wall-clock
//! stamps and cut into hand-offs, each from one process's `exited` to the next `spawned` (of
//! another process); the parts of a hand-off are the intervals between the consecutive
//! events of the path it waited on (the holder's events until the waiter's first, then the
//! waiter's), named by their two events (`h:` the holder's, `w:` the waiter's).
//!
//! What is asserted: every run has the common events once each and in order (`acquiring` <
//! `acquired` < `spawned` < `exited` < `release-sent` < `released`); the commands never
//! overlap (spawns and exits alternate on the merged time line); in every hand-off the
//! holder's `release-sent` comes before the waiter's `acquired`, and a `woken` of the waiter
//! before its `acquired`; and the parts, and the phases, add up to the gap. The figures are measured, not
//! asserted: `DLOCK_HANDOFF_REPORT=FILE` appends each backend's gap, its four phases
//! ([`Handoff::phases`]) and its parts (median, p90, and the time per hand-off, whose sum is
//! the mean gap) to FILE as rows of one markdown table. The figures count only the
//! hand-offs to a waiter that was already queued (its backend's `queued` event; `acquiring`
//! where a backend has none) when the holder's command exited: a loop still starting or
//! connecting its next run would add that to the gap.
//! Size: P = `DLOCK_HANDOFF_PROCESSES` loops (default 4; more keep the server's queue fuller,
//! so fewer hand-offs are left out), K = `DLOCK_HANDOFF_RUNS` runs each (default 10);
//! `scripts/handoff-parts` runs every backend with more. Each backend's folder expands
//! [`handoff_test!`] with its server: `backends::NAME::handoff`. `DLOCK_HANDOFF_TIMELINE=FILE` writes the merged time line
//! (µs from the first event, pid, event) for a closer look.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::support::*;

/// Concurrent `dlock run` loops: `DLOCK_HANDOFF_PROCESSES`, default 4.
fn processes() -> usize {
    env_count("DLOCK_HANDOFF_PROCESSES", 4).max(2)
}
/// Bound for one run (waiting for the others included).
const RUN_BOUND: Duration = Duration::from_secs(120);
/// The common events of one run, in the order they must come.
const COMMON: [&str; 6] = [
    "acquiring",
    "acquired",
    "spawned",
    "exited",
    "release-sent",
    "released",
];

fn runs() -> usize {
    env_count("DLOCK_HANDOFF_RUNS", 10)
}

/// One hand-off event: when (µs since the epoch), which process, what.
#[derive(Clone, Debug)]
struct Event {
    at: u64,
    pid: u32,
    name: String,
}

/// The hand-off events in one process's stderr (`dlock: handoff SECS.MICROS pid=PID NAME`);
/// a malformed event line fails the test.
fn events_in(stderr: &str) -> Vec<Event> {
    stderr
        .lines()
        .filter_map(|line| line.strip_prefix("dlock: handoff "))
        .map(|rest| {
            let mut words = rest.splitn(3, ' ');
            let (stamp, pid, name) = (words.next(), words.next(), words.next());
            let parsed = (|| {
                let (secs, micros) = stamp?.split_once('.')?;
                (micros.len() == 6).then_some(())?;
                let at = secs.parse::<u64>().ok()? * 1_000_000 + micros.parse::<u64>().ok()?;
                let pid = pid?.strip_prefix("pid=")?.parse().ok()?;
                let name = name?.trim().to_owned();
                (!name.is_empty()).then_some(Event { at, pid, name })
            })();
            parsed.unwrap_or_else(|| panic!("malformed hand-off line: {rest:?}"))
        })
        .collect()
}

/// Run the loops and return every run's events (one vector per run).
fn contend(server: &dyn LockServer) -> Vec<Vec<Event>> {
    let env = TestEnv::new(server);
    let lock = lock_name("handoff");
    let k = runs();
    std::thread::scope(|scope| {
        let loops: Vec<_> = (0..processes())
            .map(|_| {
                let (env, lock) = (&env, &lock);
                scope.spawn(move || {
                    (0..k)
                        .map(|_| {
                            let mut command = env.dlock(["run", lock, "sleep", "0.001"]);
                            command.env("DLOCK_LOG", "dlock::handoff=debug");
                            let out = output_within(command, RUN_BOUND);
                            assert!(out.status.success(), "{}", describe(&out));
                            events_in(&stderr_of(&out))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        loops
            .into_iter()
            .flat_map(|l| l.join().expect("a dlock loop panicked"))
            .collect()
    })
}

/// Every run has the common events once each, in order.
fn assert_common_events_in_order(runs: &[Vec<Event>]) {
    for events in runs {
        let common: Vec<&str> = events
            .iter()
            .map(|e| e.name.as_str())
            .filter(|n| COMMON.contains(n))
            .collect();
        assert_eq!(common, COMMON, "a run's common events: {events:?}");
        let at = |name: &str| events.iter().find(|e| e.name == name).map(|e| e.at);
        for pair in COMMON.windows(2) {
            assert!(
                at(pair[0]) <= at(pair[1]),
                "{pair:?} out of time order: {events:?}"
            );
        }
    }
}

/// One hand-off: the holder's and the waiter's events from the holder's `exited` to the
/// waiter's `spawned`, named `h:…` / `w:…`, with their times.
struct Handoff {
    events: Vec<(String, u64)>,
    /// The path the hand-off waited on: the holder's events until the waiter's first one,
    /// then the waiter's. What the holder does after that (the rest of its release) runs
    /// beside the waiter and is left out, so the parts do not depend on how the two
    /// processes' events happen to interleave.
    path: Vec<(String, u64)>,
    /// The waiter was already in the server's queue (`queued`; on a backend that does not
    /// mark it, acquiring) when the holder's command exited; otherwise the hand-off includes
    /// the waiter's start and connection, and it is left out of the figures.
    waited: bool,
}

impl Handoff {
    fn gap(&self) -> u64 {
        self.events.last().map_or(0, |e| e.1) - self.events.first().map_or(0, |e| e.1)
    }

    /// The intervals between consecutive events of the path: (`a→b`, µs, start offset from
    /// `exited`).
    fn parts(&self) -> Vec<(String, u64, u64)> {
        let start = self.path.first().map_or(0, |e| e.1);
        self.path
            .windows(2)
            .map(|w| {
                (
                    format!("{}→{}", w[0].0, w[1].0),
                    w[1].1 - w[0].1,
                    w[0].1 - start,
                )
            })
            .collect()
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.events.iter().position(|e| e.0 == name)
    }

    /// The gap in four phases, which add up to it whatever the events in between: the
    /// holder's release until its last step before the waiter's first (`holder`), from
    /// there to the waiter's first step (`notice`), the waiter's steps until `acquired`
    /// (`grant`), and starting the command (`spawn`).
    fn phases(&self) -> [u64; 4] {
        let path = &self.path;
        let first = path
            .iter()
            .position(|e| e.0.starts_with("w:"))
            .unwrap_or(0)
            .max(1);
        let at = |name: &str| path.iter().find(|e| e.0 == name).map_or(0, |e| e.1);
        let (start, end) = (path[0].1, path[path.len() - 1].1);
        let (holder_end, waiter_start, acquired) =
            (path[first - 1].1, path[first].1, at("w:acquired"));
        [
            holder_end - start,
            waiter_start - holder_end,
            acquired - waiter_start,
            end - acquired,
        ]
    }
}

/// The phases of [`Handoff::phases`], as the report names them.
const PHASES: [&str; 4] = [
    "*holder*: h:exited→its last step before the waiter's first",
    "*notice*: →the waiter's first step",
    "*grant*: the waiter's steps →w:acquired",
    "*spawn*: w:acquired→w:spawned",
];

/// Merge all events by time and cut the time line into hand-offs; asserts that the commands
/// never overlap and that each hand-off's events come in an order a hand-off allows.
fn handoffs(runs: &[Vec<Event>]) -> Vec<Handoff> {
    let mut all: Vec<(usize, Event)> = runs
        .iter()
        .flat_map(|events| events.iter().enumerate().map(|(i, e)| (i, e.clone())))
        .collect();
    // By time; within one process, in the order it wrote them.
    all.sort_by_key(|(i, e)| (e.at, e.pid, *i));
    let all: Vec<Event> = all.into_iter().map(|(_, e)| e).collect();
    // A waiter counts as waiting once it is in the server's queue (`queued`, on backends
    // that mark it), else once it is acquiring.
    let waiting_event = if all.iter().any(|e| e.name == "queued") {
        "queued"
    } else {
        "acquiring"
    };
    if let Ok(path) = std::env::var("DLOCK_HANDOFF_TIMELINE") {
        let start = all.first().map_or(0, |e| e.at);
        let text: String = all
            .iter()
            .map(|e| format!("{:>10} {:>8} {}\n", e.at - start, e.pid, e.name))
            .collect();
        std::fs::write(&path, text).expect("write the time line");
    }
    let commands: Vec<&Event> = all
        .iter()
        .filter(|e| e.name == "spawned" || e.name == "exited")
        .collect();
    for (i, e) in commands.iter().enumerate() {
        let expected = if i % 2 == 0 { "spawned" } else { "exited" };
        assert_eq!(e.name, expected, "two commands overlapped around {e:?}");
        if i % 2 == 1 {
            assert_eq!(e.pid, commands[i - 1].pid, "exit of another process: {e:?}");
        }
    }
    assert_eq!(
        commands.len(),
        2 * runs.len(),
        "one spawn and one exit per run"
    );
    let index_of = |e: &Event| {
        all.iter()
            .position(|x| x.at == e.at && x.pid == e.pid && x.name == e.name)
            .expect("an event of the time line")
    };
    commands[1..]
        .chunks(2)
        .filter(|pair| pair.len() == 2)
        .map(|pair| {
            let (exited, spawned) = (pair[0], pair[1]);
            let (holder, waiter) = (exited.pid, spawned.pid);
            assert_ne!(holder, waiter, "one process spawned twice");
            let waited = all
                .iter()
                .any(|e| e.pid == waiter && e.name == waiting_event && e.at < exited.at);
            let events: Vec<(String, u64)> = all[index_of(exited)..=index_of(spawned)]
                .iter()
                .filter(|e| e.pid == holder || e.pid == waiter)
                .map(|e| {
                    let side = if e.pid == holder { "h" } else { "w" };
                    (format!("{side}:{}", e.name), e.at)
                })
                .collect();
            let first_of_waiter = events
                .iter()
                .position(|e| e.0.starts_with("w:"))
                .unwrap_or(events.len());
            let path = events
                .iter()
                .enumerate()
                .filter(|(i, e)| *i < first_of_waiter || e.0.starts_with("w:"))
                .map(|(_, e)| e.clone())
                .collect();
            let handoff = Handoff {
                events,
                path,
                waited,
            };
            let at = |name: &str| handoff.position(name);
            let shown = || format!("{:?}", handoff.events);
            let acquired = at("w:acquired").unwrap_or_else(|| panic!("no w:acquired: {}", shown()));
            let sent =
                at("h:release-sent").unwrap_or_else(|| panic!("no h:release-sent: {}", shown()));
            assert!(
                sent < acquired,
                "acquired before the release was sent: {}",
                shown()
            );
            if let Some(woken) = at("w:woken") {
                assert!(woken < acquired, "w:woken after w:acquired: {}", shown());
            }
            let sum: u64 = handoff.parts().iter().map(|p| p.1).sum();
            assert_eq!(
                sum,
                handoff.gap(),
                "the parts do not add up to the gap: {}",
                shown()
            );
            let phases: u64 = handoff.phases().iter().sum();
            assert_eq!(
                phases,
                handoff.gap(),
                "the phases do not add up to the gap: {}",
                shown()
            );
            handoff
        })
        .collect()
}

/// The value at quantile `q` (nearest rank) of `values`, sorted here.
fn quantile(values: &mut [u64], q: f64) -> u64 {
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

fn ms(micros: f64) -> String {
    format!("{:.2}", micros / 1000.0)
}

const HEADER: &str = "| backend | part | n | median ms | p90 ms | ms per hand-off | share |\n\
                      |---|---|---|---|---|---|---|\n";

/// The report rows of one backend: the gap, then each part in the order it typically comes,
/// of the hand-offs whose waiter was waiting; then how many were left out.
fn report(label: &str, handoffs: &[Handoff]) -> String {
    let late = handoffs.iter().filter(|h| !h.waited).count();
    let handoffs: Vec<&Handoff> = handoffs.iter().filter(|h| h.waited).collect();
    let n = handoffs.len();
    if n == 0 {
        return format!(
            "| {label} | no hand-off to a waiting waiter ({late} to late ones) | 0 | | | | |\n"
        );
    }
    let mut gaps: Vec<u64> = handoffs.iter().map(|h| h.gap()).collect();
    let total: u64 = gaps.iter().sum();
    let mut parts: BTreeMap<String, (Vec<u64>, u64)> = BTreeMap::new();
    for handoff in &handoffs {
        for (name, took, offset) in handoff.parts() {
            let entry = parts.entry(name).or_default();
            entry.0.push(took);
            entry.1 += offset;
        }
    }
    let mut rows = format!(
        "| {label} | **gap** h:exited→w:spawned | {n} | {} | {} | {} | 100% |\n",
        ms(quantile(&mut gaps, 0.5) as f64),
        ms(quantile(&mut gaps, 0.9) as f64),
        ms(total as f64 / n as f64)
    );
    for (i, phase) in PHASES.iter().enumerate() {
        let mut values: Vec<u64> = handoffs.iter().map(|h| h.phases()[i]).collect();
        let sum: u64 = values.iter().sum();
        let _ = writeln!(
            rows,
            "| {label} | {phase} | {n} | {} | {} | {} | {:.0}% |",
            ms(quantile(&mut values, 0.5) as f64),
            ms(quantile(&mut values, 0.9) as f64),
            ms(sum as f64 / n as f64),
            100.0 * sum as f64 / total.max(1) as f64
        );
    }
    let mut ordered: Vec<(String, Vec<u64>, f64)> = parts
        .into_iter()
        .map(|(name, (values, offsets))| {
            let mean_offset = offsets as f64 / values.len() as f64;
            (name, values, mean_offset)
        })
        .collect();
    ordered.sort_by(|a, b| a.2.total_cmp(&b.2));
    for (name, mut values, _) in ordered {
        let sum: u64 = values.iter().sum();
        let _ = writeln!(
            rows,
            "| {label} | {name} | {} | {} | {} | {} | {:.0}% |",
            values.len(),
            ms(quantile(&mut values, 0.5) as f64),
            ms(quantile(&mut values, 0.9) as f64),
            ms(sum as f64 / n as f64),
            100.0 * sum as f64 / total.max(1) as f64
        );
    }
    if late > 0 {
        let _ = writeln!(
            rows,
            "| {label} | left out: the waiter was not yet queued | {late} | | | | |"
        );
    }
    rows
}

/// Contend and check one backend: every run succeeds, its events come in order, and the
/// commands never overlap.
fn check(server: &dyn LockServer) -> Vec<Handoff> {
    let runs = contend(server);
    assert_eq!(runs.len(), processes() * self::runs());
    assert_common_events_in_order(&runs);
    let handoffs = handoffs(&runs);
    assert_eq!(handoffs.len(), runs.len() - 1, "one hand-off between runs");
    handoffs
}

/// The hand-off checks without the figures, for the contract's busy-machine case.
pub(crate) fn hand_offs_succeed_without_overlap(server: &dyn LockServer) {
    check(server);
}

/// Contend and check one backend; with `DLOCK_HANDOFF_REPORT` (`scripts/handoff-parts`),
/// also report its figures. The test suite checks, the script measures.
pub fn measure(server: &dyn LockServer, label: &str) {
    let handoffs = check(server);
    if std::env::var_os("DLOCK_HANDOFF_REPORT").is_some() {
        let rows = report(label, &handoffs);
        eprintln!("{HEADER}{rows}");
        append_report("DLOCK_HANDOFF_REPORT", HEADER, &rows);
    }
}

/// The hand-off measurement of one backend, `backends::NAME::handoff`, expanded in its folder
/// (`tests/backends/NAME/mod.rs`): `crate::handoff_test!("redis", RedisServer::start());`.
#[macro_export]
macro_rules! handoff_test {
    ($label:expr, $start:expr) => {
        #[test]
        fn handoff() {
            $crate::handoff::measure(&$start, $label);
        }
    };
}

/// Under `-vv` (no `DLOCK_LOG`) the hand-off events carry the same stamp, and the other
/// lines stay as they were.
#[test]
fn handoff_events_under_vv_carry_time_and_pid() {
    let (_server, env) = file_env();
    let out = env.run(["run", "-vv", &lock_name("vv"), "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let stderr = stderr_of(&out);
    let events = events_in(&stderr);
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    let common: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| COMMON.contains(n))
        .collect();
    assert_eq!(common, COMMON, "{stderr}");
    assert!(names.contains(&"token-written"), "{stderr}");
    assert!(events.iter().all(|e| e.pid == events[0].pid), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with("dlock: acquired '")),
        "{stderr}"
    );
}
