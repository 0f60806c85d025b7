//! The file-name stem of a lock name: what the file backend's lock files
//! (`<stem>.lock`, `<stem>#i.lock`) and the host-local queue's tickets (`<stem>.tickets`,
//! `<stem>.<n>.ticket`) are named after.

use sha2::{Digest, Sha256};

use crate::lock::LockName;

/// The longest stem: room is left for a suffix such as `#1024.lock` within a file system's
/// 255 bytes.
const MAX_STEM: usize = 200;

/// The file-name stem of a lock name: [`LockName::encoded`], shortened and made unique with a
/// SHA-256 suffix when the file system would not take it.
pub(crate) fn stem(name: &LockName) -> String {
    let encoded = name.encoded();
    if encoded.len() <= MAX_STEM {
        return encoded;
    }
    let digest = Sha256::digest(name.as_str().as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    // The encoding is ASCII, so any byte index is a char boundary.
    format!("{}~{hex}", &encoded[..120])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_get_short_unique_stems() {
        let a = LockName::new(&"é".repeat(127)).unwrap();
        let b = LockName::new(&format!("{}x", "é".repeat(126))).unwrap();
        assert!(stem(&a).len() < 255 - "#1024.lock".len());
        assert_ne!(stem(&a), stem(&b));
    }
}
