//! The one-line verdict protocol between a firmware program and `cargo xtask qemu`.
//!
//! A program's run ends with exactly one line
//!
//! ```text
//! NPRDMA-VERDICT: PASS <short summary>
//! NPRDMA-VERDICT: FAIL <reason>
//! ```
//!
//! followed by power-off. The harness passes a run only if it saw the PASS line and QEMU
//! exited with status 0; a FAIL line, no line, a timeout or another exit status fail it.
//! The runtime prints the line; programs return a [`Verdict`]. Control characters in the
//! message are replaced by spaces so the verdict always stays on one line.

use core::fmt::{self, Write};

/// The prefix the harness looks for.
pub const PREFIX: &str = "NPRDMA-VERDICT:";

/// Pass or fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The program checked what it set out to check.
    Pass,
    /// Something unexpected happened.
    Fail,
}

impl Outcome {
    /// The protocol word.
    pub const fn word(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
        }
    }
}

/// Capacity of a [`Message`] in bytes.
pub const MESSAGE_CAPACITY: usize = 200;

/// A short formatted message in a fixed-capacity string (there is no allocator). Text beyond
/// [`MESSAGE_CAPACITY`] is cut at a character boundary and marked with `...`.
#[derive(Clone)]
pub struct Message {
    text: heapless::String<MESSAGE_CAPACITY>,
    truncated: bool,
}

impl Message {
    /// An empty message.
    pub const fn new() -> Self {
        Self {
            text: heapless::String::new(),
            truncated: false,
        }
    }

    /// Formats `args` into a new message.
    pub fn format(args: fmt::Arguments<'_>) -> Self {
        let mut m = Self::new();
        // `write_str` below never fails; overflow is recorded as truncation.
        let _ = m.write_fmt(args);
        m
    }

    /// The text (without the truncation marker).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether text was cut off.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }
}

impl Default for Message {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Write for Message {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.truncated {
            return Ok(());
        }
        // Whole `char`s only: the first one that does not fit ends the message.
        for c in s.chars() {
            if self.text.push(c).is_err() {
                self.truncated = true;
                break;
            }
        }
        Ok(())
    }
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())?;
        if self.truncated {
            f.write_str("...")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// What a program's run function returns.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// Pass or fail.
    pub outcome: Outcome,
    /// Summary (pass) or reason (fail).
    pub message: Message,
}

impl Verdict {
    /// A pass with a short summary.
    pub fn pass(args: fmt::Arguments<'_>) -> Self {
        Self {
            outcome: Outcome::Pass,
            message: Message::format(args),
        }
    }

    /// A failure with its reason.
    pub fn fail(args: fmt::Arguments<'_>) -> Self {
        Self {
            outcome: Outcome::Fail,
            message: Message::format(args),
        }
    }
}

/// Writes through to `inner`, replacing every control character (including newlines) by a
/// space.
struct OneLine<'w, W: Write + ?Sized>(&'w mut W);

impl<W: Write + ?Sized> Write for OneLine<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(pos) = rest.find(char::is_control) {
            let (text, tail) = rest.split_at(pos);
            self.0.write_str(text)?;
            self.0.write_char(' ')?;
            let mut chars = tail.chars();
            chars.next();
            rest = chars.as_str();
        }
        self.0.write_str(rest)
    }
}

/// Writes the verdict line for `outcome` with the message `args`, ending in `\n`.
pub fn write_line<W: Write + ?Sized>(
    out: &mut W,
    outcome: Outcome,
    args: fmt::Arguments<'_>,
) -> fmt::Result {
    write!(out, "{PREFIX} {} ", outcome.word())?;
    OneLine(out).write_fmt(args)?;
    out.write_char('\n')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn line(outcome: Outcome, args: fmt::Arguments<'_>) -> String {
        let mut s = String::new();
        write_line(&mut s, outcome, args).unwrap();
        s
    }

    #[test]
    fn lines_match_the_protocol() {
        assert_eq!(
            line(Outcome::Pass, format_args!("edu at {}", "00:02.0")),
            "NPRDMA-VERDICT: PASS edu at 00:02.0\n"
        );
        assert_eq!(
            line(
                Outcome::Fail,
                format_args!("panic at a.rs:1:2: boom\nsecond\r")
            ),
            "NPRDMA-VERDICT: FAIL panic at a.rs:1:2: boom second \n"
        );
    }

    #[test]
    fn message_truncates_at_a_char_boundary() {
        let long = "é".repeat(MESSAGE_CAPACITY); // 2 bytes each
        let m = Message::format(format_args!("{long}"));
        assert!(m.is_truncated());
        assert_eq!(m.as_str().len(), MESSAGE_CAPACITY);
        assert_eq!(
            m.to_string(),
            format!("{}...", "é".repeat(MESSAGE_CAPACITY / 2))
        );

        let odd = format!("x{long}");
        let m = Message::format(format_args!("{odd}"));
        // 1 + 99 * 2 = 199 bytes fit; the 100th 'é' would cross the end.
        assert_eq!(m.as_str().len(), MESSAGE_CAPACITY - 1);
        assert!(m.is_truncated());
    }

    proptest! {
        #[test]
        fn any_message_is_exactly_one_line(text in any::<String>()) {
            let l = line(Outcome::Fail, format_args!("{text}"));
            prop_assert!(l.starts_with("NPRDMA-VERDICT: FAIL "));
            prop_assert_eq!(l.matches('\n').count(), 1);
            prop_assert!(l.ends_with('\n'));
            prop_assert!(!l.contains('\r'));
            let body = &l["NPRDMA-VERDICT: FAIL ".len()..l.len() - 1];
            prop_assert_eq!(body.chars().count(), text.chars().count());
        }

        #[test]
        fn short_messages_round_trip(text in "[ -~]{0,200}") {
            let m = Message::format(format_args!("{text}"));
            prop_assert_eq!(m.as_str(), text.as_str());
            prop_assert!(!m.is_truncated());
        }
    }
}
