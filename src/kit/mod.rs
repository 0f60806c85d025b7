//! What the backends share, written once: the kit a backend folder imports besides the seam
//! (`lock.rs`, `kind.rs`). A backend folder never imports another backend folder, nor the
//! registry (`backend/mod.rs`); what two of them need is here.
//!
//! Nothing in the kit names a backend or imports one, so it sits below them all.
//!
//! - [`timeouts`]: how long one call to a server may take.
//! - [`backoff`]: the jittered, growing pauses between retries.
//! - [`capacity`]: refusals of a server that is full, waited out within `--wait`.
//! - [`url`]: the URL grammar of the network backends and their query parameters.
//! - [`tls`]: the TLS set-up the rustls-based clients need.
//! - [`error_text`]: a client library's error and its causes in words.
//! - [`limit`]: the `--limit` agreement between holders.
//! - [`held`]: `list`'s held locks and the words of a not-acquired message.
//! - [`http`]: the HTTP/1.1 client of the backends that speak HTTP (the object stores), and
//!   [`xml`], what they read of their servers' XML.
//! - [`round_trip`]: `check`'s round-trip measurement.
//! - `flock`, `lock_dir`, `proc_locks`, `stem`: the kernel locks, the checked lock directory,
//!   the kernel's table of holders and the lock files' names, which the file backend and the
//!   host-local queue are both built from (crate-internal).
//! - [`local_queue`]: the host-local queue every remote backend is wrapped in.
//! - [`owed`]: what a waiter may have left on a server, given back on the way out.

pub mod backoff;
pub mod capacity;
pub mod error_text;
pub(crate) mod flock;
pub mod held;
pub mod http;
pub mod limit;
pub mod local_queue;
pub(crate) mod lock_dir;
pub mod owed;
pub(crate) mod proc_locks;
pub mod round_trip;
pub(crate) mod stem;
pub mod timeouts;
pub mod tls;
pub mod url;
pub mod xml;
