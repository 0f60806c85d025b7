//! Reading `--report` files, and a URL of the backend under test that reaches no server.

use std::path::Path;

use super::*;

/// Every line of the report at `path`, each parsed as one JSON object (a line that is not
/// one fails the test).
pub fn report_lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read the report {}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not one JSON object: {line:?}: {e}\n{text}"));
            assert!(value.is_object(), "not an object: {line}");
            value
        })
        .collect()
}

/// The only line of the report at `path`.
pub fn report_line(path: &Path) -> serde_json::Value {
    let mut lines = report_lines(path);
    assert_eq!(lines.len(), 1, "one line expected: {lines:?}");
    lines.remove(0)
}

/// `url` (of the backend under test) with every loopback endpoint moved to a free port, a
/// socket path to one that does not exist, and a file backend's directory under a regular
/// file: a URL of the same backend that reaches nothing.
pub fn unreachable_url(env: &TestEnv, url: &str) -> String {
    if let Some(_dir) = url.strip_prefix("file://") {
        let blocker = env.path("not-a-directory");
        std::fs::write(&blocker, b"").expect("write a file in the way");
        return format!("file://{}/locks", blocker.display());
    }
    if let Some((scheme, _)) = url.split_once("+unix://") {
        return format!("{scheme}+unix://{}", env.path("no-such.sock").display());
    }
    let port = free_port().to_string();
    let mut out = String::new();
    let mut rest = url;
    while let Some(at) = rest.find("127.0.0.1:") {
        let (before, after) = rest.split_at(at + "127.0.0.1:".len());
        out.push_str(before);
        out.push_str(&port);
        rest = after.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    assert_ne!(out, url, "no loopback endpoint in {url}");
    out
}
