//! The module's C header (linux-glue/kernel/nprdma_abi.h) against abi.rs: compiles the header
//! in user space with the host's C compiler (its `_Static_assert`s pin the layouts there) and
//! compares every size, offset and constant it prints with the Rust side.
#![cfg(target_os = "linux")]

use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use linux_glue::abi::{self, *};

/// `(C expression, Rust value)`: what the probe prints and what it must equal.
fn expected() -> Vec<(&'static str, u64)> {
    macro_rules! size {
        ($c:literal, $t:ty) => {
            (concat!("sizeof(struct ", $c, ")"), size_of::<$t>() as u64)
        };
    }
    macro_rules! off {
        ($c:literal, $t:ty, $f:ident) => {
            (
                concat!("offsetof(struct ", $c, ", ", stringify!($f), ")"),
                offset_of!($t, $f) as u64,
            )
        };
    }
    vec![
        ("NPRDMA_ABI_VERSION", u64::from(ABI_VERSION)),
        ("NPRDMA_IOCTL_MAGIC", u64::from(IOCTL_MAGIC)),
        ("NPRDMA_IOC_VERSION", u64::from(IOC_VERSION)),
        ("NPRDMA_IOC_REGISTER", u64::from(IOC_REGISTER)),
        ("NPRDMA_IOC_UNREGISTER", u64::from(IOC_UNREGISTER)),
        ("NPRDMA_IOC_FAULT_IN", u64::from(IOC_FAULT_IN)),
        ("NPRDMA_IOC_RING_SETUP", u64::from(IOC_RING_SETUP)),
        ("NPRDMA_IOC_RESOLVE", u64::from(IOC_RESOLVE)),
        ("NPRDMA_IOC_DMA_ATTACH", u64::from(IOC_DMA_ATTACH)),
        ("NPRDMA_IOC_DMA", u64::from(IOC_DMA)),
        ("NPRDMA_FEATURE_DMA", u64::from(FEATURE_DMA)),
        ("NPRDMA_DMA_TO_DEVICE", u64::from(DMA_TO_DEVICE)),
        ("NPRDMA_DMA_FROM_DEVICE", u64::from(DMA_FROM_DEVICE)),
        ("NPRDMA_DMA_BUFFER_BYTES", u64::from(DMA_BUFFER_BYTES)),
        ("NPRDMA_FEATURE_HUGE", u64::from(FEATURE_HUGE)),
        ("NPRDMA_FEATURE_RING", u64::from(FEATURE_RING)),
        ("NPRDMA_FEATURE_RESOLVE", u64::from(FEATURE_RESOLVE)),
        ("NPRDMA_ACCESS_READ", u64::from(ACCESS_READ)),
        ("NPRDMA_ACCESS_WRITE", u64::from(ACCESS_WRITE)),
        ("NPRDMA_FAULT_IN_QUERY_ONLY", u64::from(FAULT_IN_QUERY_ONLY)),
        ("NPRDMA_KIND_PRESENT", u64::from(kind::PRESENT)),
        ("NPRDMA_KIND_MINOR", u64::from(kind::MINOR)),
        ("NPRDMA_KIND_MAJOR", u64::from(kind::MAJOR)),
        ("NPRDMA_KIND_ABSENT", u64::from(kind::ABSENT)),
        ("NPRDMA_CAUSE_REMOVED", u64::from(cause::REMOVED)),
        ("NPRDMA_CAUSE_UNMAPPED", u64::from(cause::UNMAPPED)),
        ("NPRDMA_CAUSE_REMAPPED", u64::from(cause::REMAPPED)),
        ("NPRDMA_CAUSE_SWAPPED_OUT", u64::from(cause::SWAPPED_OUT)),
        ("NPRDMA_CAUSE_DROPPED", u64::from(cause::DROPPED)),
        (
            "NPRDMA_CAUSE_FRAME_CHANGED",
            u64::from(cause::FRAME_CHANGED),
        ),
        ("NPRDMA_CAUSE_CLEARED", u64::from(cause::CLEARED)),
        ("NPRDMA_CAUSE_PROTECTION", u64::from(cause::PROTECTION)),
        ("NPRDMA_CAUSE_RELEASED", u64::from(cause::RELEASED)),
        ("NPRDMA_RECORD_NONBLOCKING", u64::from(RECORD_NONBLOCKING)),
        ("NPRDMA_CAUSE_DEVICE_FAULT", u64::from(cause::DEVICE_FAULT)),
        ("NPRDMA_RECORD_DEVICE_WRITE", u64::from(RECORD_DEVICE_WRITE)),
        ("NPRDMA_ENTRY_PRESENT", PageStateEntry::PRESENT),
        ("NPRDMA_ENTRY_WRITABLE", PageStateEntry::WRITABLE),
        ("NPRDMA_ENTRY_HUGE", PageStateEntry::HUGE),
        ("NPRDMA_ENTRY_VERSION_SHIFT", 32),
        size!("nprdma_abi_header", AbiHeader),
        size!("nprdma_version_args", VersionArgs),
        off!("nprdma_version_args", VersionArgs, module_version),
        off!("nprdma_version_args", VersionArgs, features),
        size!("nprdma_register_args", RegisterArgs),
        off!("nprdma_register_args", RegisterArgs, addr),
        off!("nprdma_register_args", RegisterArgs, len),
        off!("nprdma_register_args", RegisterArgs, access),
        off!("nprdma_register_args", RegisterArgs, flags),
        off!("nprdma_register_args", RegisterArgs, region_id),
        off!("nprdma_register_args", RegisterArgs, table_offset),
        off!("nprdma_register_args", RegisterArgs, table_entries),
        off!("nprdma_register_args", RegisterArgs, status),
        off!("nprdma_register_args", RegisterArgs, reserved),
        size!("nprdma_unregister_args", UnregisterArgs),
        off!("nprdma_unregister_args", UnregisterArgs, region_id),
        off!("nprdma_unregister_args", UnregisterArgs, status),
        size!("nprdma_fault_in_args", FaultInArgs),
        off!("nprdma_fault_in_args", FaultInArgs, region_id),
        off!("nprdma_fault_in_args", FaultInArgs, addr),
        off!("nprdma_fault_in_args", FaultInArgs, len),
        off!("nprdma_fault_in_args", FaultInArgs, access),
        off!("nprdma_fault_in_args", FaultInArgs, flags),
        off!("nprdma_fault_in_args", FaultInArgs, pages_mapped),
        off!("nprdma_fault_in_args", FaultInArgs, minor_faults),
        off!("nprdma_fault_in_args", FaultInArgs, major_faults),
        off!("nprdma_fault_in_args", FaultInArgs, huge_blocks),
        off!("nprdma_fault_in_args", FaultInArgs, status),
        size!("nprdma_ring_setup_args", RingSetupArgs),
        off!("nprdma_ring_setup_args", RingSetupArgs, entries),
        off!("nprdma_ring_setup_args", RingSetupArgs, flags),
        off!("nprdma_ring_setup_args", RingSetupArgs, ring_offset),
        off!("nprdma_ring_setup_args", RingSetupArgs, ring_bytes),
        off!("nprdma_ring_setup_args", RingSetupArgs, status),
        size!("nprdma_resolve_args", ResolveArgs),
        off!("nprdma_resolve_args", ResolveArgs, region_id),
        off!("nprdma_resolve_args", ResolveArgs, addr),
        off!("nprdma_resolve_args", ResolveArgs, access),
        off!("nprdma_resolve_args", ResolveArgs, flags),
        off!("nprdma_resolve_args", ResolveArgs, pfn),
        off!("nprdma_resolve_args", ResolveArgs, mapping_start),
        off!("nprdma_resolve_args", ResolveArgs, order),
        off!("nprdma_resolve_args", ResolveArgs, kind),
        off!("nprdma_resolve_args", ResolveArgs, version),
        off!("nprdma_resolve_args", ResolveArgs, status),
        size!("nprdma_ring_header", RingHeader),
        off!("nprdma_ring_header", RingHeader, entries),
        off!("nprdma_ring_header", RingHeader, entry_size),
        off!("nprdma_ring_header", RingHeader, dropped),
        off!("nprdma_ring_header", RingHeader, producer),
        off!("nprdma_ring_header", RingHeader, consumer),
        size!("nprdma_invalidation_record", InvalidationRecord),
        off!("nprdma_invalidation_record", InvalidationRecord, seq),
        off!("nprdma_invalidation_record", InvalidationRecord, region_id),
        off!("nprdma_invalidation_record", InvalidationRecord, start),
        off!("nprdma_invalidation_record", InvalidationRecord, len),
        off!("nprdma_invalidation_record", InvalidationRecord, cause),
        off!("nprdma_invalidation_record", InvalidationRecord, flags),
        off!("nprdma_invalidation_record", InvalidationRecord, new_start),
        size!("nprdma_table_header", TableHeader),
        off!("nprdma_table_header", TableHeader, region_id),
        off!("nprdma_table_header", TableHeader, entries),
        off!("nprdma_table_header", TableHeader, generation),
        size!("nprdma_dma_attach_args", DmaAttachArgs),
        off!("nprdma_dma_attach_args", DmaAttachArgs, flags),
        off!("nprdma_dma_attach_args", DmaAttachArgs, status),
        off!("nprdma_dma_attach_args", DmaAttachArgs, pgsize_bitmap),
        off!("nprdma_dma_attach_args", DmaAttachArgs, aperture_end),
        off!("nprdma_dma_attach_args", DmaAttachArgs, pci_address),
        off!("nprdma_dma_attach_args", DmaAttachArgs, reserved),
        size!("nprdma_dma_args", DmaArgs),
        off!("nprdma_dma_args", DmaArgs, region_id),
        off!("nprdma_dma_args", DmaArgs, addr),
        off!("nprdma_dma_args", DmaArgs, len),
        off!("nprdma_dma_args", DmaArgs, direction),
        off!("nprdma_dma_args", DmaArgs, dev_offset),
        off!("nprdma_dma_args", DmaArgs, flags),
        off!("nprdma_dma_args", DmaArgs, pages),
        off!("nprdma_dma_args", DmaArgs, present_before),
        off!("nprdma_dma_args", DmaArgs, version_before),
        off!("nprdma_dma_args", DmaArgs, version_after),
        off!("nprdma_dma_args", DmaArgs, elapsed_ns),
        off!("nprdma_dma_args", DmaArgs, stale),
        off!("nprdma_dma_args", DmaArgs, status),
    ]
}

#[test]
fn the_modules_c_header_has_the_layouts_and_numbers_of_abi_rs() {
    let kernel = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernel");
    if !Path::new("/usr/include/linux/ioctl.h").exists() {
        eprintln!(
            "SKIP the_modules_c_header_has_the_layouts_and_numbers_of_abi_rs: no <linux/ioctl.h> (apt-get install linux-libc-dev)"
        );
        return;
    }
    let expected = expected();
    let mut probe =
        String::from("#include <stdio.h>\n#include \"nprdma_abi.h\"\nint main(void)\n{\n");
    for (c, _) in &expected {
        probe.push_str(&format!(
            "\tprintf(\"%s=%llu\\n\", \"{}\", (unsigned long long)({c}));\n",
            c.replace('"', "\\\"")
        ));
    }
    probe.push_str("\tprintf(\"DEVICE=/dev/%s\\n\", NPRDMA_DEVICE_NAME);\n\treturn 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("nprdma-kernel-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(&src, probe).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let Ok(out) = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Werror", "-I"])
        .arg(&kernel)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
    else {
        eprintln!(
            "SKIP the_modules_c_header_has_the_layouts_and_numbers_of_abi_rs: no C compiler `{cc}`"
        );
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    assert!(
        out.status.success(),
        "nprdma_abi.h does not compile (a _Static_assert failed?):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = Command::new(&exe).output().expect("run the probe");
    let _ = std::fs::remove_dir_all(&dir);
    let printed = String::from_utf8_lossy(&printed.stdout).into_owned();
    let mut seen = 0;
    for line in printed.lines() {
        let (name, value) = line.split_once('=').expect("name=value");
        if name == "DEVICE" {
            assert_eq!(value, abi::DEVICE_NODE);
            continue;
        }
        let want = expected
            .iter()
            .find(|(c, _)| *c == name)
            .map(|(_, v)| *v)
            .expect("a name the probe was given");
        assert_eq!(value.parse::<u64>().ok(), Some(want), "{name}");
        seen += 1;
    }
    assert_eq!(seen, expected.len());
}
