//! The program console: [`print!`](crate::print) and [`println!`](crate::println) write plain
//! text to the platform's UART (bare-metal builds only; there is one CPU and no interrupts, so
//! no locking), `write_str` writes a string without `core::fmt` (the defmt logger's path, see
//! [`logger`](crate::logger)). Output is best effort: a stuck UART drops characters rather than
//! hanging.
//!
//! Plain text is for the lines that must be readable without a decoder or before the logger
//! can run: the runtime's boot lines, exception and panic reports, the verdict, and lines a
//! harness parses. Program logs go through defmt.

/// Sends `text` through `put_byte`, turning each LF into CR LF (what a serial terminal
/// expects); shared by the UART drivers' `fmt::Write`. Bytes `put_byte` drops are dropped.
pub fn write_crlf(text: &str, mut put_byte: impl FnMut(u8) -> bool) {
    for byte in text.bytes() {
        if byte == b'\n' {
            put_byte(b'\r');
        }
        put_byte(byte);
    }
}

/// Writes `text` to the console as it is, without `core::fmt` (the defmt logger's path).
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub fn write_str(text: &str) {
    crate::rt::with_console(|console| {
        let _ = console.write_str(text);
    });
}

/// Writes formatted text to the console; used by the print macros.
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub fn _print(args: core::fmt::Arguments<'_>) {
    crate::rt::with_console(|console| {
        let _ = console.write_fmt(args);
    });
}

/// The console as a [`core::fmt::Write`] sink, for plain text (see the module docs).
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
#[derive(Debug, Default)]
pub struct Console;

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
impl core::fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        write_str(s);
        Ok(())
    }
}

/// Prints to the console.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::console::_print(::core::format_args!($($arg)*))
    };
}

/// Prints to the console, with a newline (sent as CR LF).
#[macro_export]
macro_rules! println {
    () => {
        $crate::console::_print(::core::format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::console::_print(::core::format_args!("{}\n", ::core::format_args!($($arg)*)))
    };
}
