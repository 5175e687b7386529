//! Errors, argument parsing and command helpers.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

/// Everything that can go wrong in xtask, each printed as one line.
#[derive(Debug)]
pub enum XtaskError {
    /// Bad command line.
    Usage(String),
    /// A tool is missing; names the Debian package that provides it.
    MissingTool { tool: String, package: &'static str },
    /// Packages are missing and we cannot install them.
    CannotInstall(String),
    /// A command ran and failed.
    CommandFailed { what: String, status: ExitStatus },
    /// A command could not be started.
    Spawn { what: String, error: std::io::Error },
    /// A firmware test did not pass.
    FirmwareFailed { name: String, reason: String },
    /// Several checks failed.
    Checks(Vec<String>),
    /// Anything else.
    Other(String),
}

impl fmt::Display for XtaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XtaskError::Usage(m) => write!(f, "{m}"),
            XtaskError::MissingTool { tool, package } => write!(
                f,
                "`{tool}` not found: install the Debian package `{package}` (`cargo xtask setup` does, as root)"
            ),
            XtaskError::CannotInstall(m) => write!(f, "{m}"),
            XtaskError::CommandFailed { what, status } => write!(f, "{what} failed ({status})"),
            XtaskError::Spawn { what, error } => write!(f, "could not run {what}: {error}"),
            XtaskError::FirmwareFailed { name, reason } => write!(f, "firmware `{name}`: {reason}"),
            XtaskError::Checks(failed) => {
                write!(f, "{} check(s) failed: {}", failed.len(), failed.join("; "))
            }
            XtaskError::Other(m) => write!(f, "{m}"),
        }
    }
}

/// A tiny command-line parser: flags, `--key value` options and positionals.
pub struct Options {
    args: Vec<String>,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Self, XtaskError> {
        Ok(Self {
            args: args.to_vec(),
        })
    }

    /// Removes and returns whether `name` was given.
    pub fn flag(&mut self, name: &str) -> bool {
        let before = self.args.len();
        self.args.retain(|a| a != name);
        self.args.len() != before
    }

    /// Removes `name <n>` and returns `n`.
    pub fn value_u64(&mut self, name: &str) -> Result<Option<u64>, XtaskError> {
        self.value_str(name)?
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| XtaskError::Usage(format!("{name} takes a whole number")))
            })
            .transpose()
    }

    /// Removes `name <text>` and returns `text`.
    pub fn value_str(&mut self, name: &str) -> Result<Option<String>, XtaskError> {
        let Some(i) = self.args.iter().position(|a| a == name) else {
            return Ok(None);
        };
        let value = self
            .args
            .get(i + 1)
            .cloned()
            .ok_or_else(|| XtaskError::Usage(format!("{name} needs a value")))?;
        self.args.drain(i..i + 2);
        Ok(Some(value))
    }

    /// Removes and returns the first positional argument.
    pub fn positional(&mut self, what: &str) -> Result<String, XtaskError> {
        let i = self
            .args
            .iter()
            .position(|a| !a.starts_with("--"))
            .ok_or_else(|| XtaskError::Usage(format!("missing {what}")))?;
        Ok(self.args.remove(i))
    }

    /// Fails if anything is left over.
    pub fn finish(self) -> Result<(), XtaskError> {
        match self.args.first() {
            None => Ok(()),
            Some(a) => Err(XtaskError::Usage(format!("unexpected argument `{a}`"))),
        }
    }
}

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Finds `tool` on PATH (or as an absolute path).
pub fn which(tool: &str) -> Option<PathBuf> {
    let p = Path::new(tool);
    if p.is_absolute() {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(tool))
                .find(|c| c.is_file())
        })
        .unwrap_or(None)
}

/// Fails with a one-line error naming the package when `tool` is missing.
pub fn require_tool(tool: &str, package: &'static str) -> Result<PathBuf, XtaskError> {
    which(tool).ok_or_else(|| XtaskError::MissingTool {
        tool: tool.to_string(),
        package,
    })
}

/// Runs a command to completion with inherited stdio.
pub fn run_status(what: &str, cmd: &mut Command) -> Result<(), XtaskError> {
    let status = cmd.status().map_err(|error| XtaskError::Spawn {
        what: what.to_string(),
        error,
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(XtaskError::CommandFailed {
            what: what.to_string(),
            status,
        })
    }
}

/// Prints a section header.
pub fn section(title: &str) {
    println!("\n==> {title}");
}

/// The lines of `reader`, each decoded lossily: one byte that is not UTF-8 (a dumped log, a
/// console escape) must not end the stream, as `BufRead::lines` would, and lose every line
/// after it. A trailing `\r` is dropped.
pub fn lossy_lines(reader: impl std::io::Read) -> impl Iterator<Item = String> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(reader);
    std::iter::from_fn(move || {
        let mut buf = Vec::new();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                while matches!(buf.last(), Some(b'\n' | b'\r')) {
                    buf.pop();
                }
                Some(String::from_utf8_lossy(&buf).into_owned())
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_that_is_not_utf8_loses_no_line() {
        let input: &[u8] =
            b"NPRDMA-RXE: PASS a\r\n  srv| garbage \xff\xfe\nNPRDMA-RXE: PASS b\nNPRDMA-RXE: DONE";
        let lines: Vec<String> = lossy_lines(input).collect();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert_eq!(lines[0], "NPRDMA-RXE: PASS a");
        assert!(lines[1].starts_with("  srv| garbage "));
        assert_eq!(lines[3], "NPRDMA-RXE: DONE");
    }

    #[test]
    fn option_values_are_taken_before_the_positional() {
        let args: Vec<String> = ["--timeout", "30", "pci-probe"].map(String::from).to_vec();
        let mut o = Options::parse(&args).unwrap();
        assert_eq!(o.value_u64("--timeout").unwrap(), Some(30));
        assert_eq!(o.positional("program").unwrap(), "pci-probe");
        o.finish().unwrap();
    }
}
