//! The command-line definition: parsing, normalisation and clap's own consistency checks.

use super::*;

fn norm(words: &[&str]) -> Vec<String> {
    let args = words.iter().map(OsString::from).collect();
    normalize_run_args(args, &Cli::command())
        .into_iter()
        .map(|w| w.into_string().unwrap())
        .collect()
}

#[test]
fn cli_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn options_after_name_belong_to_the_command() {
    assert_eq!(
        norm(&["dlock", "run", "--ttl", "5s", "x", "./job.sh", "--ttl", "5"]),
        ["dlock", "run", "--ttl", "5s", "--", "x", "./job.sh", "--ttl", "5"]
    );
    assert_eq!(
        norm(&["dlock", "run", "x", "--wait", "1s"]),
        ["dlock", "run", "--", "x", "--wait", "1s"]
    );
}

#[test]
fn double_dash_is_optional() {
    assert_eq!(
        norm(&["dlock", "run", "x", "--", "a", "--", "b"]),
        ["dlock", "run", "--", "x", "a", "--", "b"]
    );
    assert_eq!(
        norm(&["dlock", "-v", "run", "-nE5", "x", "a"]),
        ["dlock", "-v", "run", "-nE5", "--", "x", "a"]
    );
    assert_eq!(
        norm(&["dlock", "run", "-w", "1s", "--", "-x", "a"]),
        ["dlock", "run", "-w", "1s", "--", "-x", "a"]
    );
}

#[test]
fn shell_command_may_follow_name() {
    assert_eq!(
        norm(&["dlock", "run", "x", "-c", "echo hi"]),
        ["dlock", "run", "--command=echo hi", "--", "x"]
    );
    assert_eq!(
        norm(&["dlock", "run", "-c", "true", "x"]),
        ["dlock", "run", "-c", "true", "--", "x"]
    );
}

#[test]
fn parses_after_normalizing() {
    let cli = parse(
        ["dlock", "run", "-t", "5s", "x", "echo", "-t"]
            .iter()
            .map(OsString::from)
            .collect(),
    )
    .unwrap();
    let Command::Run(run) = cli.command else {
        panic!("not run")
    };
    assert_eq!(run.ttl.as_deref(), Some("5s"));
    assert_eq!(run.name, "x");
    assert_eq!(run.command, ["echo", "-t"]);
}

/// Counts the heap calls (allocations, frees, reallocations) of the thread that makes them,
/// so that a test sees its own and not those of the tests running beside it.
struct CountingAllocator;

thread_local! {
    static HEAP_CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count_heap_call() {
    // `try_with`: the allocator is also called while the thread's locals are torn down.
    let _ = HEAP_CALLS.try_with(|calls| calls.set(calls.get() + 1));
}

// SAFETY: every call is passed on unchanged to the system allocator.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count_heap_call();
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        count_heap_call();
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        count_heap_call();
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        count_heap_call();
        unsafe { std::alloc::System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Heap calls made by `read` on this thread.
fn heap_calls_of<T>(read: impl FnOnce() -> T) -> (T, u64) {
    let before = HEAP_CALLS.with(|calls| calls.get());
    let out = read();
    (out, HEAP_CALLS.with(|calls| calls.get()) - before)
}

const A_RUN: [&str; 7] = [
    "dlock",
    "run",
    "--url",
    "file:///tmp/x",
    "nightly",
    "--",
    "true",
];

/// Every `dlock run` pays for parsing its command line before it does anything: the everyday
/// line is read without building clap's command tree (docs/performance.md).
#[test]
fn parsing_a_run_builds_no_command_tree() {
    let (cli, calls) = heap_calls_of(|| parse(A_RUN.iter().map(OsString::from).collect()));
    assert!(cli.is_ok(), "{cli:?}");
    // 22 calls; clap's reading of the same line makes about 980.
    const BUDGET: u64 = 60;
    assert!(
        calls < BUDGET,
        "parsing a run made {calls} heap calls (budget {BUDGET})"
    );
}

/// Where clap reads the line (every other command, help, errors), the tree it builds is left
/// to the process's exit, not freed piece by piece (a third of the heap calls of parsing).
#[test]
fn clap_leaves_the_command_tree_to_the_process_exit() {
    let (cli, calls) =
        heap_calls_of(|| parse_with_clap(A_RUN.iter().map(OsString::from).collect()));
    assert!(cli.is_ok(), "{cli:?}");
    // 1,132 calls with clap 4.6, `hold` (which repeats run's options: 977 before it) and
    // `--also` (each option of `run` adds about 23 in both); about 40 more with a second tree
    // built for the global options, a third more if the tree is dropped.
    const BUDGET: u64 = 1_200;
    assert!(
        calls < BUDGET,
        "parsing a run made {calls} heap calls (budget {BUDGET})"
    );
}
