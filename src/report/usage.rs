//! How clap's usage errors are reported: one `dlock:` line and exit 64 (help and version go
//! to stdout, exit 0).

use crate::exit::Code;

/// Report a command-line error as one `dlock:` line (help and version go to stdout, exit 0).
pub fn clap_error(err: clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = err.print();
            0
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = err.print();
            Code::Usage.value()
        }
        _ => {
            let text = err.to_string();
            let first = text.lines().next().unwrap_or("bad usage");
            let message = first.strip_prefix("error: ").unwrap_or(first);
            // "the following required arguments were not provided:" lists them on the
            // indented lines below: name them on the one line (`<NAME>`).
            let listed: Vec<&str> = text
                .lines()
                .skip(1)
                .take_while(|l| l.starts_with("  "))
                .map(str::trim)
                .collect();
            let message = if message.ends_with(':') && !listed.is_empty() {
                format!("{message} {}", listed.join(", "))
            } else {
                message.to_owned()
            };
            let tip = text
                .lines()
                .map(str::trim)
                .find_map(|l| l.strip_prefix("tip: "))
                .map(|t| format!("; {t}"))
                .unwrap_or_default();
            if message.ends_with("--help") {
                say!("{message}");
            } else {
                say!("{message}{tip} (see 'dlock --help')");
            }
            Code::Usage.value()
        }
    }
}
