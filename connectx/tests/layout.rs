//! The committed ABI numbers (src/sys/layout.rs) against the rdma-core headers installed on
//! this machine: compiles and runs tools/layout-probe.c. `cargo xtask setup` installs
//! libibverbs-dev, so on a project machine this always runs; elsewhere it says why it cannot.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

#[test]
fn committed_layout_matches_installed_headers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("SKIPPED: <infiniband/verbs.h> not installed (apt-get install libibverbs-dev)");
        return;
    }
    let out = std::env::temp_dir().join(format!("nprdma-layout-probe-{}", std::process::id()));
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg("-o")
        .arg(&out)
        .arg(root.join("tools/layout-probe.c"))
        .status();
    let Ok(status) = status else {
        eprintln!("SKIPPED: no C compiler");
        return;
    };
    assert!(
        status.success(),
        "the probe does not compile against the installed headers"
    );
    let printed = Command::new(&out).output().expect("run probe");
    let _ = std::fs::remove_file(&out);
    let probe: HashMap<String, u64> = String::from_utf8_lossy(&printed.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_uppercase().replace('.', "_"), v.parse().ok()?))
        })
        .collect();
    let committed = std::fs::read_to_string(root.join("src/sys/layout.rs")).unwrap();
    let mut checked = 0;
    for line in committed.lines() {
        let Some(rest) = line.strip_prefix("pub const ") else {
            continue;
        };
        let (name, value) = rest.split_once(": usize = ").unwrap();
        let value: u64 = value.trim_end_matches(';').parse().unwrap();
        assert_eq!(
            probe.get(name),
            Some(&value),
            "{name}: the installed rdma-core differs; run sh tools/gen-layout.sh and review"
        );
        checked += 1;
    }
    assert_eq!(
        checked,
        probe.len(),
        "probe and committed file list different fields"
    );
    assert!(checked > 150);
}
