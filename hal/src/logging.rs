//! The logging shim: `hal::info!("...", x)` and friends, for driver code that runs both on the
//! target and on the host.
//!
//! - feature `defmt` (target builds): forwards to defmt, whose frames are decoded on the host
//!   (the firmware sends them over the console; see docs/architecture.md, "Logging on the
//!   target").
//! - feature `log` (host builds): forwards to the `log` facade.
//! - neither: the arguments are evaluated for type checking and dropped.
//!
//! defmt must never be enabled on the host: its macros need a global logger at link time and
//! host test binaries have none (knurling-rs/defmt#1037). Use only format strings both
//! backends accept: `{}`, `{:?}`, `{:x}`, `{:#x}`; with `defmt` every argument must implement
//! `defmt::Format`. The crates the firmware uses (this one, `protocol`, `smmu-driver`,
//! `dma-engine`, `boards`) derive it on their error types behind a `defmt` feature of their
//! own, which only the firmware's bare-metal build turns on. Code that only ever runs on the
//! target (the firmware's programs) uses defmt's macros directly, with typed parameters such
//! as `{=u32:#x}`.

macro_rules! define_log_macro {
    ($d:tt $name:ident, $level:ident) => {
        #[doc = concat!("Logs at `", stringify!($level), "` level through the shim.")]
        #[cfg(feature = "defmt")]
        #[macro_export]
        macro_rules! $name {
                            // defmt's macros emit `defmt::...` paths resolved at the call site: bring the crate
            // into scope so callers need no defmt dependency of their own.
            ($d($d arg:tt)*) => {{
                use $crate::__private::defmt;
                defmt::$level!($d($d arg)*)
            }};
                        }
        #[doc = concat!("Logs at `", stringify!($level), "` level through the shim.")]
        #[cfg(all(feature = "log", not(feature = "defmt")))]
        #[macro_export]
        macro_rules! $name {
                            ($d($d arg:tt)*) => { $crate::__private::log::$level!($d($d arg)*) };
                        }
        #[doc = concat!("Logs at `", stringify!($level), "` level through the shim.")]
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        #[macro_export]
        macro_rules! $name {
                            ($fmt:literal $d(, $d arg:expr)* $d(,)?) => {{
                                $d( let _ = &$d arg; )*
                            }};
                        }
    };
}

define_log_macro!($ error, error);
define_log_macro!($ warn, warn);
define_log_macro!($ info, info);
define_log_macro!($ debug, debug);
define_log_macro!($ trace, trace);
