//! Errors in words, for messages: a client library's error and each of its causes
//! ([`chain_text`]), and an operating-system error without its number ([`io_words`]), a
//! refused permission with whose the path is and what to do ([`permission_denied`]).

use std::error::Error as StdError;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// An operating-system error in words, without Rust's `(os error N)`: "permission denied",
/// "no space left on device".
pub fn io_words(err: &io::Error) -> String {
    let text = err.to_string();
    let words = match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => &text[..at],
        _ => &text,
    };
    let mut chars = words.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// `text` without Rust's ` (os error N)` after an operating-system error's words: "broken
/// pipe (os error 32)" → "broken pipe".
pub fn without_os_error_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    // Bounded: each round consumes at least the marker it found.
    while let Some(at) = rest.find(" (os error ") {
        let after = &rest[at + " (os error ".len()..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        if digits > 0 && after[digits..].starts_with(')') {
            out.push_str(&rest[..at]);
            rest = &after[digits + 1..];
        } else {
            out.push_str(&rest[..at + 1]);
            rest = &rest[at + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// `permission denied: the directory DIR is bob's (mode 755) and dlock runs as alice; …`:
/// [`whose`] for a lock directory or file, and what to do.
pub fn permission_denied(path: &Path) -> String {
    format!(
        "permission denied: {}; run dlock as a user who may use it, or give a lock directory \
         of your own (DLOCK_DIR, or --url file:///DIR)",
        whose(path)
    )
}

/// `the directory DIR is bob's (mode 755) and dlock runs as alice`: whose `path` is (itself,
/// or the nearest directory above it that exists), for a refused permission.
pub fn whose(path: &Path) -> String {
    // The user the kernel checked, not $USER (which a `su` or `sudo -E` may have kept).
    let me = user_of_uid(nix::unistd::geteuid().as_raw());
    let found = path
        .ancestors()
        .find_map(|p| std::fs::metadata(p).ok().map(|meta| (p, meta)));
    match found {
        Some((p, meta)) => {
            let kind = if meta.is_dir() { "directory" } else { "file" };
            format!(
                "the {kind} {} is {}'s (mode {:o}) and dlock runs as {me}",
                p.display(),
                user_of_uid(meta.uid()),
                meta.mode() & 0o7777
            )
        }
        None => format!("dlock runs as {me}"),
    }
}

/// An error opening or reading `path` in words: a refused permission says whose it is
/// ([`whose`]), anything else as [`io_words`].
pub fn file_error(path: &Path, err: &io::Error) -> String {
    match err.kind() {
        io::ErrorKind::PermissionDenied => format!("permission denied: {}", whose(path)),
        _ => io_words(err),
    }
}

/// The name of the user `uid` (the number where the user database has none).
fn user_of_uid(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => user.name,
        _ => format!("uid {uid}"),
    }
}

/// `e` and its causes, joined by ": ", leaving out a cause whose words the text already has
/// (libraries often repeat their source in their own message).
pub fn chain_text(e: &(dyn StdError + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Layer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn StdError + 'static))
        }
    }

    #[test]
    fn causes_are_joined_once() {
        let e = Layer(
            "cannot connect: timed out",
            Some(Box::new(Layer(
                "timed out",
                Some(Box::new(Layer("os error 110", None))),
            ))),
        );
        assert_eq!(chain_text(&e), "cannot connect: timed out: os error 110");
    }

    #[test]
    fn os_errors_read_as_words() {
        let denied = io::Error::from_raw_os_error(13);
        assert_eq!(io_words(&denied), "permission denied");
        let full = io::Error::from_raw_os_error(28);
        assert_eq!(io_words(&full), "no space left on device");
        assert_eq!(
            without_os_error_numbers(
                "error connecting to server: Connection reset by peer (os error 104)"
            ),
            "error connecting to server: Connection reset by peer"
        );
        assert_eq!(
            without_os_error_numbers("a (os error x) stays"),
            "a (os error x) stays"
        );
        let custom = io::Error::other("the server closed the connection");
        assert_eq!(io_words(&custom), "the server closed the connection");
    }
}
