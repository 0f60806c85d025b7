//! Lock directories others can write to or own: symbolic links, other users' files and
//! directories, hard links, and the sticky bit.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::support::*;

/// `file://` URL of a directory.
fn url_of(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// A directory with exactly `mode` (set after creation, so the umask does not interfere).
/// A lock directory of root's (0755) that other users can reach (the test's scratch, 0711).
fn roots_lock_dir(env: &TestEnv) -> PathBuf {
    std::fs::set_permissions(env.scratch.path(), std::fs::Permissions::from_mode(0o711))
        .expect("chmod");
    dir_with_mode(&env.path("locks"), 0o755)
}

/// Root's lock file `data.lock` in `dir`, with `mode`.
fn roots_lock_file(dir: &Path, mode: u32) -> PathBuf {
    let lock = dir.join("data.lock");
    std::fs::write(&lock, b"").expect("create the lock file");
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(mode)).expect("chmod");
    lock
}

fn dir_with_mode(path: &Path, mode: u32) -> PathBuf {
    std::fs::create_dir_all(path).expect("mkdir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path.to_owned()
}

/// The uid of "nobody", standing in for another user (the tests run as root).
const OTHER_UID: u32 = 65534;

fn give_to_other_user(path: &Path) {
    nix::unistd::chown(path, Some(nix::unistd::Uid::from_raw(OTHER_UID)), None)
        .expect("chown (these tests run as root)");
}

/// `run`, `status` and `list` of lock `x` with `flags` (the flags go before the name).
fn run_status_list(flags: &[&str]) -> [Vec<String>; 3] {
    let with = |sub: &str, rest: &[&str]| -> Vec<String> {
        std::iter::once(sub)
            .chain(flags.iter().copied())
            .chain(rest.iter().copied())
            .map(str::to_owned)
            .collect()
    };
    [
        with("run", &["x", "touch", "ran"]),
        with("status", &["x"]),
        with("list", &[]),
    ]
}

#[test]
fn prefix_directory_swapped_for_a_symlink_is_refused() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    // The victim: a directory of root's with a file where the lock file would be.
    let victim_dir = dir_with_mode(&env.path("victim"), 0o755);
    let victim = victim_dir.join("x.lock");
    std::fs::write(&victim, b"root's data\n").expect("write victim");
    // A base directory others can write to, world-writable with and without the sticky bit,
    // where someone made team.d a symbolic link to the victim directory.
    for (mode, complaint) in [(0o777, "sticky bit"), (0o1777, "symbolic link")] {
        let base = dir_with_mode(&env.path(&format!("base-{mode:o}")), mode);
        let team = base.join("team.d");
        std::os::unix::fs::symlink(&victim_dir, &team).expect("symlink");
        let url = url_of(&base);
        for args in run_status_list(&["--url", &url, "--prefix", "team"]) {
            let out = env.run(&args);
            assert_fails(&out, 73, complaint);
            assert!(stderr_of(&out).contains(&base.display().to_string()));
            assert!(!env.path("ran").exists(), "{args:?} ran its command");
            assert_eq!(
                std::fs::read(&victim).expect("victim"),
                b"root's data\n",
                "{args:?} wrote through the symlink"
            );
        }
    }
}

#[test]
fn base_directory_owned_by_another_user_is_refused() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let base = dir_with_mode(&env.path("theirs"), 0o755);
    give_to_other_user(&base);
    let url = url_of(&base);
    for flags in [&["--url", &url][..], &["--url", &url, "--prefix", "team"]] {
        for args in run_status_list(flags) {
            let out = env.run(&args);
            assert_fails(&out, 73, &format!("owned by uid {OTHER_UID}"));
            assert!(stderr_of(&out).contains(&base.display().to_string()));
            assert!(!env.path("ran").exists(), "{args:?} ran its command");
        }
    }
    assert_eq!(
        std::fs::read_dir(&base).expect("read_dir").count(),
        0,
        "dlock created something in the other user's directory"
    );
    // The same for a symbolic link of theirs as the directory, even to a directory of ours.
    let ours = dir_with_mode(&env.path("ours"), 0o755);
    let link = env.path("their-link");
    std::os::unix::fs::symlink(&ours, &link).expect("symlink");
    std::os::unix::fs::lchown(&link, Some(OTHER_UID), None).expect("lchown");
    let url = url_of(&link);
    for args in run_status_list(&["--url", &url]) {
        let out = env.run(&args);
        assert_fails(&out, 73, "symbolic link");
        assert!(!env.path("ran").exists(), "{args:?} ran its command");
    }
    // And for a prefix directory of theirs in a directory of ours.
    give_to_other_user(&dir_with_mode(&ours.join("team.d"), 0o755));
    let url = url_of(&ours);
    for args in run_status_list(&["--url", &url, "--prefix", "team"]) {
        let out = env.run(&args);
        assert_fails(&out, 73, &format!("owned by uid {OTHER_UID}"));
        assert!(stderr_of(&out).contains("team.d"));
    }
}

#[test]
fn sticky_shared_directory_works_and_prefix_directories_are_private() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let base = dir_with_mode(&env.path("shared"), 0o1777);
    let url = url_of(&base);
    let out = env.run(["run", "--url", &url, "x", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["run", "--url", &url, "--prefix", "team", "x", "true"]);
    assert!(out.status.success(), "{}", describe(&out));
    let team = std::fs::symlink_metadata(base.join("team.d")).expect("team.d");
    assert!(team.is_dir());
    assert_eq!(team.mode() & 0o7777, 0o700);
    assert!(base.join("team.d").join("x.lock").exists());
}

#[test]
fn lock_file_planted_in_a_shared_directory_is_not_trusted() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let base = dir_with_mode(&env.path("shared"), 0o1777);
    let url = url_of(&base);
    // Another user's file, and a file of root's that anyone can write.
    let theirs = base.join("x.lock");
    std::fs::write(&theirs, format!("fence {:020}\n", 1)).expect("write");
    give_to_other_user(&theirs);
    let open = base.join("y.lock");
    std::fs::write(&open, format!("fence {:020}\n", 1)).expect("write");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    for (name, path) in [("x", &theirs), ("y", &open)] {
        let commands = [
            vec!["run", "--url", &url, name, "touch", "ran"],
            vec!["status", "--url", &url, name],
        ];
        for args in commands {
            let out = env.run(&args);
            assert_fails(&out, 73, &path.display().to_string());
            assert!(!env.path("ran").exists(), "ran on a planted lock file");
        }
    }
    assert_eq!(
        std::fs::read(&theirs).expect("read"),
        format!("fence {:020}\n", 1).as_bytes()
    );
}

#[test]
fn hard_link_in_a_shared_directory_is_refused() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let base = dir_with_mode(&env.path("shared"), 0o1777);
    let victim = env.path("victim");
    std::fs::write(&victim, b"root's data\n").expect("write victim");
    std::fs::hard_link(&victim, base.join("x.lock")).expect("link");
    let url = url_of(&base);
    let out = env.run(["run", "--url", &url, "x", "touch", "ran"]);
    assert_fails(&out, 73, "link");
    assert!(!env.path("ran").exists());
    assert_eq!(std::fs::read(&victim).expect("victim"), b"root's data\n");
}

/// A user who shares locks through the recipe of docs/backends/file.md (a directory of
/// root's that only root can write to, lock files of root's the user's group can write)
/// takes them shared as well as exclusively, and leaves nothing in the directory: not even a
/// shared holder killed with SIGKILL.
#[test]
fn the_multi_user_recipe_takes_shared_locks_and_leaves_nothing_behind() {
    use std::os::unix::process::CommandExt;
    const USER: u32 = 424_243;
    const TEAM: u32 = 424_242;
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let dir = roots_lock_dir(&env);
    let lock = roots_lock_file(&dir, 0o660);
    nix::unistd::chown(&lock, None, Some(nix::unistd::Gid::from_raw(TEAM))).expect("chgrp");
    let url = url_of(&dir);
    let as_user = |args: &[&str]| {
        let mut command = env.dlock(args);
        command
            .env("DLOCK_URL", &url)
            .uid(USER)
            .gid(TEAM)
            .current_dir("/");
        command
    };

    let out = output_within(as_user(&["run", "--shared", "data", "true"]), PATIENCE);
    assert!(out.status.success(), "{}", describe(&out));
    let out = output_within(as_user(&["run", "data", "true"]), PATIENCE);
    assert!(out.status.success(), "{}", describe(&out));
    // Two shared holders at once, one of them killed.
    let ready = env.path("ready");
    std::fs::write(&ready, b"").expect("create");
    std::os::unix::fs::chown(&ready, Some(USER), None).expect("chown");
    let script = format!("echo $$ > '{}'; exec sleep 1000", ready.display());
    let mut reader = as_user(&["run", "--shared", "data", "sh", "-c", &script])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn a shared holder");
    wait_until("the shared holder holds", PATIENCE, || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s.ends_with('\n'))
    });
    let out = output_within(
        as_user(&["run", "--shared", "--no-wait", "data", "true"]),
        PATIENCE,
    );
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.run(["status", "--json", "--url", &url, "data"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["holders"][0]["pid"], reader.id(), "{status}");
    let _ = reader.kill();
    let _ = reader.wait();
    let entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("read_dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(entries, ["data.lock"], "dlock left files in the directory");
}

/// In a directory everyone can write to (with the sticky bit), a file another user put where
/// a lock's turnstile goes cannot stop a run: the turnstile only orders shared runs behind
/// waiting exclusive ones, so the run goes on without it, and says so.
#[test]
fn a_turnstile_another_user_planted_stops_no_run() {
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let base = dir_with_mode(&env.path("shared"), 0o1777);
    let planted = base.join("x.turnstile");
    std::fs::write(&planted, b"").expect("write");
    give_to_other_user(&planted);
    let url = url_of(&base);
    let out = env.run(["run", "--url", &url, "--shared", "x", "touch", "ran"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(env.path("ran").exists());
    assert!(
        stderr_of(&out).contains(&planted.display().to_string()),
        "{}",
        describe(&out)
    );
    // An exclusive run that has to wait goes on without it too.
    let reader = env.hold("x", &["--url", &url, "--shared"]);
    let mut writer = env.spawn(&["run", "--url", &url, "x", "touch", "writer-ran"]);
    let writer_pid = u64::from(writer.id());
    wait_until("the exclusive run waits", PATIENCE, || {
        let out = env.run(["status", "--json", "--url", &url, "x"]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        json["waiting_here"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w["pid"].as_u64() == Some(writer_pid)))
    });
    drop(reader);
    let status = wait_within(&mut writer, PATIENCE);
    assert!(status.success(), "{status}: {}", stderr_left(&mut writer));
    assert!(env.path("writer-ran").exists());
}

/// A lock directory or lock file the user may not write is 77, said in words (never "os
/// error 13"), naming whose it is and the way out.
#[test]
fn a_lock_directory_or_file_the_user_may_not_use_names_whose_it_is() {
    use std::os::unix::process::CommandExt;
    const USER: u32 = 424_245;
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    let dir = roots_lock_dir(&env);
    let as_user = |args: &[&str]| {
        let mut command = env.dlock(args);
        command
            .env("DLOCK_URL", url_of(&dir))
            .uid(USER)
            .current_dir("/");
        command
    };
    let out = output_within(as_user(&["run", "data", "true"]), PATIENCE);
    assert_fails(
        &out,
        77,
        &format!(
            "permission denied: the directory {} is root's (mode 755) and dlock runs as uid \
             {USER}; run dlock as a user who may use it, or give a lock directory of your own \
             (DLOCK_DIR, or --url file:///DIR)",
            dir.display()
        ),
    );
    assert!(!stderr_of(&out).contains("os error"), "{}", describe(&out));
    // A lock file root made in a directory anyone may write to.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let file = dir.join("data.lock");
    std::fs::write(&file, b"").expect("create the lock file");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = output_within(as_user(&["run", "data", "true"]), PATIENCE);
    assert_fails(
        &out,
        77,
        &format!(
            "permission denied: the file {} is root's (mode 644)",
            file.display()
        ),
    );
    assert!(!stderr_of(&out).contains("os error"), "{}", describe(&out));
}

/// A user who shares a lock file with others the way that does not work is pointed to the
/// way that does: a lock file they may not write (77), and a root's lock file anyone may
/// write in a directory everyone may write to (73), each name the multi-user recipe.
#[test]
fn a_lock_file_others_cannot_share_points_to_the_multi_user_recipe() {
    use std::os::unix::process::CommandExt;
    const USER: u32 = 424_244;
    const RECIPE: &str = "locks shared between users";
    let server = FileServer::start();
    let env = TestEnv::new(&server);
    // Root's lock file, for root alone, in a directory root keeps.
    let dir = roots_lock_dir(&env);
    let lock = roots_lock_file(&dir, 0o600);
    let mut as_user = env.dlock(["run", "--url", &url_of(&dir), "data", "true"]);
    as_user.uid(USER).gid(USER).current_dir("/");
    let out = output_within(as_user, PATIENCE);
    assert_fails(&out, 77, &lock.display().to_string());
    assert!(stderr_of(&out).contains(RECIPE), "{}", describe(&out));
    // The same file made writable by everyone, in a directory everyone may write to.
    let shared = dir_with_mode(&env.path("shared"), 0o1777);
    let open = shared.join("data.lock");
    std::fs::write(&open, b"").expect("create the lock file");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let out = env.run(["run", "--url", &url_of(&shared), "data", "true"]);
    assert_fails(&out, 73, &open.display().to_string());
    assert!(stderr_of(&out).contains(RECIPE), "{}", describe(&out));
}
