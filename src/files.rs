//! Reading the small files dlock is told to trust: the config file, password files, TLS
//! material and `.pgpass`.
//!
//! Only a regular file is read, and only up to a size bound: a FIFO, a device such as
//! `/dev/zero`, a socket or a directory is refused at once instead of hanging dlock or
//! growing it without bound. The file is opened with `O_NONBLOCK`, so that even opening a FIFO
//! nobody writes to returns at once; the type is checked on the opened descriptor (`fstat`),
//! so a swap between check and read cannot slip another kind of file in.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Bound for the config file and TLS files.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// Bound for a password file.
pub const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// Read `path` as UTF-8 text if it is a regular file of at most `limit` bytes. The error says
/// what is wrong, without the path (callers name the file).
pub fn read_small_file(path: &Path, limit: u64) -> Result<String, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| crate::kit::error_text::file_error(path, &e))?;
    let meta = file
        .metadata()
        .map_err(|e| crate::kit::error_text::file_error(path, &e))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else {
            return Err("it is not a regular file".to_owned());
        };
        return Err(format!("it is {what}, not a regular file"));
    }
    if meta.len() > limit {
        return Err(too_large(limit));
    }
    read_bounded(file, limit)
}

fn read_bounded(file: File, limit: u64) -> Result<String, String> {
    let mut bytes = Vec::new();
    // One byte more than allowed tells a file that grew since fstat from one that fits.
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| crate::kit::error_text::io_words(&e))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(limit));
    }
    String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_owned())
}

fn too_large(limit: u64) -> String {
    format!("it is larger than {} KiB", limit / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_small_regular_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("f");
        std::fs::write(&path, "hello\n").expect("write");
        assert_eq!(read_small_file(&path, 100).as_deref(), Ok("hello\n"));
    }

    #[test]
    fn refuses_devices_fifos_directories_and_large_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 2048]).expect("write");
        let cases = [
            (Path::new("/dev/zero"), "a device"),
            (fifo.as_path(), "a FIFO"),
            (dir.path(), "a directory"),
            (big.as_path(), "larger than 1 KiB"),
        ];
        for (path, expected) in cases {
            let err = read_small_file(path, 1024).expect_err("must be refused");
            assert!(err.contains(expected), "{}: {err}", path.display());
        }
    }
}
