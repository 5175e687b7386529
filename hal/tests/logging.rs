//! The logging shim's `log` backend (hal's own tests enable the feature): each macro reaches
//! the `log` facade with its level, the caller's module as target, and the formatted arguments.
#![cfg(feature = "log")]

use std::sync::Mutex;

/// Records every log record as `LEVEL target: message`.
struct Recorder(Mutex<Vec<String>>);

impl log::Log for Recorder {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap().push(format!(
            "{} {}: {}",
            record.level(),
            record.target(),
            record.args()
        ));
    }
    fn flush(&self) {}
}

static RECORDER: Recorder = Recorder(Mutex::new(Vec::new()));

#[test]
fn the_log_backend_forwards_level_call_site_and_formatted_arguments() {
    // The only logger of this test binary.
    log::set_logger(&RECORDER).unwrap();
    log::set_max_level(log::LevelFilter::Trace);
    let far = 0x8000_1000u64;
    hal::error!("context bank {} faulted", 3);
    hal::warn!("fault at {:#x}", far);
    hal::info!("{:?}", Some(1));
    hal::debug!("{:x}", 255u8);
    hal::trace!("plain");
    let target = module_path!().to_string();
    let want = [
        format!("ERROR {target}: context bank 3 faulted"),
        format!("WARN {target}: fault at 0x80001000"),
        format!("INFO {target}: Some(1)"),
        format!("DEBUG {target}: ff"),
        format!("TRACE {target}: plain"),
    ];
    let got: Vec<String> = RECORDER
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.contains(target.as_str()))
        .cloned()
        .collect();
    assert_eq!(got, want);
}
