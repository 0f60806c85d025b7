//! What `/proc` says about a process of this host: its parent, when it started, who runs it and
//! its command line. Every function answers `None` (or an empty string) for a process that is
//! gone or cannot be read: callers show less, they never fail for it.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime};

/// Field `index` of `/proc/PID/stat` counted after the command name (which may contain spaces
/// and parentheses, so the split is at the last `)`): field 3 (state) is index 0.
fn stat_field(pid: u32, index: usize) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after) = stat.rsplit_once(')')?;
    after.split_ascii_whitespace().nth(index)?.parse().ok()
}

pub fn parent_of(pid: u32) -> Option<u32> {
    stat_field(pid, 1).and_then(|ppid| u32::try_from(ppid).ok())
}

/// Field 22 of `/proc/PID/stat`: when the process started, in clock ticks since boot. Unique
/// with the pid: a later process with the same pid started later.
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat_field(pid, 19)
}

/// When the process started, on the wall clock, to a clock tick (10 ms): its age on
/// `CLOCK_BOOTTIME`, on which the kernel counts its start, taken from now. (The start added
/// to `/proc/stat`'s `btime` would be up to a second early: `btime` is whole seconds.)
pub fn started_at(pid: u32) -> Option<SystemTime> {
    let ticks = start_ticks(pid)?;
    let per_second = u64::try_from(nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??)
        .ok()
        .filter(|&t| t > 0)?;
    let since_boot = Duration::from_millis(ticks.checked_mul(1000)? / per_second);
    let age = crate::clock::BootInstant::now()
        .since_boot()
        .saturating_sub(since_boot);
    SystemTime::now().checked_sub(age)
}

/// The name of the user the process runs as (its uid where the user database has no name).
pub fn user_of(pid: u32) -> Option<String> {
    let uid = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
    Some(
        match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
            Ok(Some(user)) => user.name,
            _ => uid.to_string(),
        },
    )
}

/// The process's arguments (`argv`), each made UTF-8 (U+FFFD for what is not). `None` for a
/// process that is gone; empty for a kernel thread.
pub fn arguments(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let raw = raw.strip_suffix(b"\0").unwrap_or(&raw);
    if raw.is_empty() {
        return Some(Vec::new());
    }
    Some(
        raw.split(|&b| b == 0)
            .map(|word| String::from_utf8_lossy(word).into_owned())
            .collect(),
    )
}

/// The value of the variable `name` in the process's environment as it started, where it may
/// be read (the user's own processes).
pub fn environment_value(pid: u32, name: &str) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    raw.split(|&b| b == 0).find_map(|entry| {
        let value = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(value).into_owned())
    })
}

/// `line` cut to at most `max` bytes at a character boundary, with `…` where it was cut.
pub(crate) fn cut_to(line: &mut String, max: usize) {
    if line.len() > max {
        let mut cut = max;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push('…');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// To a clock tick, not to the second: `status` shows a waiter's start and how long it
    /// has waited from it.
    #[test]
    fn a_process_started_now_started_now_to_a_clock_tick() {
        let before = SystemTime::now();
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .expect("spawn sleep");
        let started = started_at(child.id());
        let _ = child.kill();
        let _ = child.wait();
        let started = started.expect("the child's start time");
        // A tick (10 ms) truncated, and as much again between the reads of the two clocks.
        assert!(
            started + Duration::from_millis(20) >= before,
            "started {:?} before it was spawned",
            before.duration_since(started).unwrap_or_default()
        );
        assert!(started <= SystemTime::now());
    }

    #[test]
    fn this_process_started_before_now_and_after_boot_and_is_named_by_its_arguments() {
        let pid = std::process::id();
        let started = started_at(pid).expect("own start time");
        let now = SystemTime::now();
        assert!(started <= now, "{started:?} is after {now:?}");
        // The test binary has not run for a day.
        assert!(now.duration_since(started).expect("ordered") < Duration::from_secs(86_400));
        let own: Vec<String> = std::env::args().collect();
        assert_eq!(arguments(pid), Some(own));
        assert_eq!(
            user_of(pid).as_deref(),
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
                .as_deref()
        );
    }

    #[test]
    fn a_long_command_line_is_cut_at_a_character_boundary() {
        let mut line = "ab\u{e9}cd".to_owned();
        cut_to(&mut line, 3);
        assert_eq!(line, "ab…");
    }

    #[test]
    fn a_process_that_does_not_exist_has_nothing_to_say() {
        // Above the kernel's pid_max (4194304 at most).
        let pid = 4_194_400;
        assert_eq!(started_at(pid), None);
        assert_eq!(user_of(pid), None);
        assert_eq!(arguments(pid), None);
        assert_eq!(parent_of(pid), None);
    }
}
