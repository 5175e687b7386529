//! The layering rule of docs/architecture.md, checked: a workspace crate may depend (normal and
//! build dependencies) only on workspace crates of a strictly lower layer. Dev-dependencies are
//! free, so a driver's tests may use a model.

use std::process::Command;

use crate::util::{XtaskError, workspace_root};

/// Layer of every workspace crate, bottom = 0. Keep in step with docs/architecture.md.
pub const LAYERS: &[(&str, u32)] = &[
    ("hal", 0),
    ("protocol", 1),
    ("smmu-driver", 1),
    ("dma-engine", 2),
    ("linux-glue", 2),
    ("boards", 3),
    ("sim", 4),
    ("fpga-bitstreams", 4),
    ("firmware", 5),
    ("connectx", 5),
    ("npe-cosim", 5),
    ("nprdma", 6),
    ("xtask", 7),
];

fn layer_of(name: &str) -> Option<u32> {
    LAYERS.iter().find(|(n, _)| *n == name).map(|(_, l)| *l)
}

/// Returns one message per violation.
pub fn check() -> Result<Vec<String>, XtaskError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(workspace_root())
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .output()
        .map_err(|error| XtaskError::Spawn {
            what: "cargo metadata".into(),
            error,
        })?;
    if !out.status.success() {
        return Err(XtaskError::Other(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| XtaskError::Other(format!("cargo metadata printed invalid JSON: {e}")))?;
    Ok(violations(&meta))
}

/// The violations in `cargo metadata` output.
fn violations(meta: &serde_json::Value) -> Vec<String> {
    let packages = meta["packages"].as_array().cloned().unwrap_or_default();
    let members: Vec<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(String::from))
        .collect();
    let mut problems = Vec::new();
    for p in &packages {
        let name = p["name"].as_str().unwrap_or("?");
        let Some(own) = layer_of(name) else {
            problems.push(format!("crate `{name}` has no layer: add it to xtask/src/layers.rs and docs/architecture.md"));
            continue;
        };
        for dep in p["dependencies"].as_array().into_iter().flatten() {
            let dep_name = dep["name"].as_str().unwrap_or("?");
            let kind = dep["kind"].as_str().unwrap_or("normal");
            if kind == "dev" || !members.iter().any(|m| m == dep_name) {
                continue;
            }
            match layer_of(dep_name) {
                Some(l) if l < own => {}
                Some(l) => problems.push(format!(
                    "`{name}` (layer {own}) depends on `{dep_name}` (layer {l}): dependencies must point down"
                )),
                None => {} // reported on its own entry
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(deps: &[(&str, &[(&str, &str)])]) -> serde_json::Value {
        let packages: Vec<_> = deps
            .iter()
            .map(|(name, ds)| {
                let d: Vec<_> = ds
                    .iter()
                    .map(|(n, k)| serde_json::json!({"name": n, "kind": if *k == "normal" { serde_json::Value::Null } else { serde_json::json!(k) }}))
                    .collect();
                serde_json::json!({"name": name, "dependencies": d})
            })
            .collect();
        serde_json::json!({ "packages": packages })
    }

    #[test]
    fn downward_dependencies_pass() {
        let m = meta(&[
            ("hal", &[("tock-registers", "normal")]),
            ("sim", &[("hal", "normal")]),
            ("dma-engine", &[("hal", "normal"), ("sim", "dev")]),
        ]);
        assert!(violations(&m).is_empty(), "{:?}", violations(&m));
    }

    #[test]
    fn upward_and_sideways_dependencies_fail() {
        let m = meta(&[
            ("hal", &[]),
            ("sim", &[]),
            ("dma-engine", &[("sim", "normal")]),
            ("smmu-driver", &[]),
            ("protocol", &[("smmu-driver", "build")]),
        ]);
        let v = violations(&m);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].contains("`dma-engine` (layer 2) depends on `sim` (layer 4)"));
        assert!(v[1].contains("`protocol` (layer 1) depends on `smmu-driver` (layer 1)"));
    }

    #[test]
    fn unknown_crates_are_reported() {
        let v = violations(&meta(&[("mystery", &[])]));
        assert_eq!(v.len(), 1);
        assert!(v[0].contains("crate `mystery` has no layer"));
    }
}
