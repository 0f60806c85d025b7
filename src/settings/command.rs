//! The command to run: `COMMAND [ARGS]…` or `-c SHELL-COMMAND`, resolved on `PATH` the way
//! `execvp` would, so that a missing or non-executable command is reported (127 / 126) before
//! the lock is taken.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::secrets::redact_command;

/// The program to run.
#[derive(Clone, Debug)]
pub struct CommandSpec {
    /// The resolved executable.
    pub program: PathBuf,
    /// `argv[0]` as the user wrote it.
    pub arg0: OsString,
    pub args: Vec<OsString>,
    /// The command line for messages and holder metadata, passwords masked.
    pub display: Vec<String>,
}

impl CommandSpec {
    /// What a hold (`dlock hold`) records in place of a command: `hold`, and
    /// `--until-released` for a hold that belongs to no process.
    pub fn hold(until_released: bool) -> CommandSpec {
        let mut display = vec!["hold".to_owned()];
        if until_released {
            display.push("--until-released".to_owned());
        }
        CommandSpec {
            program: PathBuf::new(),
            arg0: "hold".into(),
            args: Vec::new(),
            display,
        }
    }

    /// Whether this is a hold's description rather than a command to run.
    pub fn is_hold(&self) -> bool {
        self.program.as_os_str().is_empty()
    }
}

pub(super) fn command_spec(
    shell_command: Option<OsString>,
    command: Vec<OsString>,
) -> Result<CommandSpec, Error> {
    let (arg0, args) = match shell_command {
        Some(script) => {
            if !command.is_empty() {
                return Err(Error::Usage(format!(
                    "-c takes one shell command and no further arguments (got '{}' after it); quote the whole command",
                    command[0].to_string_lossy()
                )));
            }
            let shell = std::env::var_os("SHELL")
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| OsString::from("/bin/sh"));
            (shell, vec![OsString::from("-c"), script])
        }
        None => {
            let mut words = command.into_iter();
            let Some(program) = words.next() else {
                return Err(Error::Usage("no command given: dlock run NAME [--] COMMAND [ARGS]... or dlock run NAME -c 'SHELL COMMAND'".into()));
            };
            (program, words.collect())
        }
    };
    let program = resolve_program(&arg0)
        .map_err(|e| options_after_name(e, &arg0))
        .map_err(|e| shell_line_as_one_word(e, &arg0, args.is_empty()))?;
    if let Some(why) = bad_interpreter(&program) {
        return Err(Error::NotFound(format!(
            "cannot run {}: {why}",
            arg0.to_string_lossy()
        )));
    }
    // Secrets in the command line (a nested `dlock run --url redis://:pw@…`, a libpq
    // `password=…`, `--token X`, `MYSQL_PWD=X`) are masked: the display form is recorded in
    // the lock's metadata, stored on the backend and shown to anyone who runs `status`.
    let words: Vec<String> = std::iter::once(&arg0)
        .chain(args.iter())
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    let display = redact_command(&words);
    Ok(CommandSpec {
        program,
        arg0,
        args,
        display,
    })
}

/// A "command not found" for a word that looks like an option (`dlock run job --no-wait
/// cmd`): options after NAME belong to the command, so say where dlock's go.
fn options_after_name(error: Error, arg0: &std::ffi::OsStr) -> Error {
    match error {
        Error::NotFound(message) if arg0.as_bytes().starts_with(b"-") => Error::NotFound(format!(
            "{message}; dlock's options go before NAME (dlock run [OPTIONS] NAME COMMAND...): \
             everything after NAME is the command's"
        )),
        other => other,
    }
}

/// A "command not found" (or no command at all) where NAME is itself a program on `PATH`
/// (`dlock run echo hello`): the first word after `run`'s options is always the lock's name.
pub(super) fn name_was_a_command(
    error: Error,
    name: &std::ffi::OsStr,
    command: &[OsString],
) -> Error {
    let looks_like_it = match &error {
        Error::NotFound(_) => !command.is_empty(),
        Error::Usage(message) => message.starts_with("no command given"),
        _ => false,
    };
    if !looks_like_it || resolve_program(name).is_err() {
        return error;
    }
    let line: Vec<String> = std::iter::once(name)
        .chain(command.iter().map(OsString::as_os_str))
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    let hint = format!(
        "'{}' was taken as the lock's NAME: dlock run NAME {}",
        name.to_string_lossy(),
        line.join(" ")
    );
    match error {
        Error::NotFound(message) => Error::NotFound(format!("{message}; {hint}")),
        Error::Usage(message) => Error::Usage(format!("{message}; {hint}")),
        other => other,
    }
}

/// A "command not found" for one word that is a whole shell line (`dlock run x 'make &&
/// ./mail-it'`): the shell runs that, with `-c`.
fn shell_line_as_one_word(error: Error, arg0: &std::ffi::OsStr, alone: bool) -> Error {
    let word = arg0.to_string_lossy();
    match error {
        Error::NotFound(message) if alone && word.trim().contains(char::is_whitespace) => {
            Error::NotFound(format!(
                "{message}; did you mean -c '{}'?",
                word.replace('\'', "'\\''")
            ))
        }
        other => other,
    }
}

/// Why the kernel would fail to start the script `program` for want of its interpreter
/// (execve's ENOENT, which reads as "command not found"): the `#!` line names a program that
/// does not exist, often `/bin/sh\r` from a file with CRLF line endings.
pub fn bad_interpreter(program: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program)
        .and_then(|mut f| f.read(&mut head))
        .ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let crlf = line.ends_with(b"\r");
    let text = String::from_utf8_lossy(line);
    let interpreter = text
        .trim_start_matches([' ', '\t'])
        .split([' ', '\t'])
        .next()?;
    if interpreter.is_empty() || Path::new(interpreter).exists() {
        return None;
    }
    let shown = interpreter.escape_debug();
    Some(if crlf {
        let bare = interpreter.trim_end_matches('\r');
        format!(
            "bad interpreter \"{shown}\": the script has CRLF (Windows) line endings, so its \
             #! line names \"{shown}\" instead of {bare}; convert it with dos2unix or \
             sed -i 's/\\r$//'"
        )
    } else {
        format!("bad interpreter {shown}: no such file (named by the script's #! line)")
    })
}

/// Find `program` the way `execvp` would, so a missing or non-executable command is reported
/// (127 / 126) before the lock is taken.
pub fn resolve_program(program: &std::ffi::OsStr) -> Result<PathBuf, Error> {
    let shown = program.to_string_lossy();
    if program.is_empty() {
        return Err(Error::NotFound(
            "command not found: '' (empty command name)".into(),
        ));
    }
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        return match check_executable(&path) {
            Ok(()) => Ok(path),
            Err(Problem::Missing) => Err(Error::NotFound(format!("command not found: {shown}"))),
            Err(Problem::NotExecutable(why)) => Err(Error::NotExecutable(format!(
                "cannot execute {shown}: {why}"
            ))),
        };
    }
    let search =
        std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    let mut first_problem = None;
    for dir in std::env::split_paths(&search) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let candidate = dir.join(program);
        match check_executable(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(Problem::Missing) => {}
            Err(Problem::NotExecutable(why)) => {
                first_problem
                    .get_or_insert(format!("cannot execute {}: {why}", candidate.display()));
            }
        }
    }
    match first_problem {
        Some(message) => Err(Error::NotExecutable(message)),
        None => Err(Error::NotFound(format!(
            "command not found: {shown} (searched PATH)"
        ))),
    }
}

enum Problem {
    Missing,
    NotExecutable(String),
}

fn check_executable(path: &Path) -> Result<(), Problem> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Problem::Missing),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Err(Problem::Missing),
        Err(e) => return Err(Problem::NotExecutable(e.to_string())),
    };
    if meta.is_dir() {
        return Err(Problem::NotExecutable("is a directory".into()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(Problem::NotExecutable(
            "permission denied (not executable)".into(),
        ));
    }
    if nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_err() {
        return Err(Problem::NotExecutable("permission denied".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_the_command_line_are_masked_in_its_display_form() {
        let words: Vec<OsString> = [
            "sh",
            "-c",
            "dlock run --url redis://:S3cret@h:6379 job -- true",
            "--url=postgres://u:S3cret@db/app?password=S3cret",
            "host=db password=S3cret",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let spec = command_spec(None, words).expect("sh resolves");
        let line = spec.display.join(" ");
        assert!(!line.contains("S3cret"), "{line}");
        assert!(line.contains("redis://:***@h:6379"), "{line}");
        // What runs is what was given.
        assert_eq!(
            spec.args[1],
            OsString::from("dlock run --url redis://:S3cret@h:6379 job -- true")
        );
    }
}
