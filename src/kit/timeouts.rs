//! How long a call to a server may take when nothing else bounds it. Every network backend
//! uses the same bounds, so `status` or `release --force` gives up on a silent server after
//! the same time whichever backend it is.

use std::time::Duration;

/// The longest one request to a server and its answer may take when neither `--wait` nor the
/// keeper bounds it (`--no-wait`, waiting without end, `status`, `list`, `release --force`,
/// `check`, the release after the command); etcd and ZooKeeper also bound reaching their
/// cluster by it. A healthy server answers in well under a millisecond, so 5 s only ever ends
/// a stalled or unreachable one. A call within `--wait` gets its share of the wait instead.
pub const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest opening a connection may take (TCP, TLS, authentication) when the URL sets no
/// timeout of its own: an unanswered SYN retransmits after 1 s and 3 s, so 5 s still lets a
/// lossy link connect while a dead host fails soon.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
