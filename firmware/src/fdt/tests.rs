use proptest::prelude::*;

use super::*;

/// The device tree QEMU 7.2 builds for `-M virt,iommu=smmuv3,gic-version=3 -cpu cortex-a57
/// -m 256M -nodefaults -device edu,addr=2` (see tests/data/README.md).
pub(crate) const VIRT_DTB: &[u8] = include_bytes!("../../tests/data/qemu-virt-7.2-smmuv3.dtb");

/// Builds small trees for error cases (layout per Devicetree Specification 5.2-5.5).
#[derive(Default)]
pub(crate) struct Builder {
    structs: Vec<u8>,
    strings: Vec<u8>,
}

impl Builder {
    pub(crate) fn word(&mut self, w: u32) -> &mut Self {
        self.structs.extend_from_slice(&w.to_be_bytes());
        self
    }
    pub(crate) fn begin(&mut self, name: &str) -> &mut Self {
        self.word(FDT_BEGIN_NODE);
        self.structs.extend_from_slice(name.as_bytes());
        self.structs.push(0);
        self.pad()
    }
    pub(crate) fn end(&mut self) -> &mut Self {
        self.word(FDT_END_NODE)
    }
    pub(crate) fn pad(&mut self) -> &mut Self {
        while !self.structs.len().is_multiple_of(4) {
            self.structs.push(0);
        }
        self
    }
    pub(crate) fn prop(&mut self, name: &str, value: &[u8]) -> &mut Self {
        let nameoff = self.strings.len() as u32;
        self.strings.extend_from_slice(name.as_bytes());
        self.strings.push(0);
        self.word(FDT_PROP).word(value.len() as u32).word(nameoff);
        self.structs.extend_from_slice(value);
        self.pad()
    }
    pub(crate) fn prop_cells(&mut self, name: &str, cells: &[u32]) -> &mut Self {
        let bytes: Vec<u8> = cells.iter().flat_map(|c| c.to_be_bytes()).collect();
        self.prop(name, &bytes)
    }
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        self.word(FDT_END);
        let off_struct = HEADER_SIZE + 16; // header + empty memory reservation map
        let off_strings = off_struct + self.structs.len();
        let total = off_strings + self.strings.len();
        let mut blob = Vec::new();
        for w in [
            MAGIC,
            total as u32,
            off_struct as u32,
            off_strings as u32,
            HEADER_SIZE as u32,
            17,
            16,
            0,
            self.strings.len() as u32,
            self.structs.len() as u32,
        ] {
            blob.extend_from_slice(&w.to_be_bytes());
        }
        blob.extend_from_slice(&[0; 16]);
        blob.extend_from_slice(&self.structs);
        blob.extend_from_slice(&self.strings);
        blob
    }
}

#[test]
fn qemu_virt_tree_has_the_documented_memory_map() {
    let fdt = Fdt::new(VIRT_DTB).unwrap();
    assert_eq!(
        format!("{fdt:?}"),
        "Fdt { total_size: 7856, structure_block: 7264, strings_block: 527 }"
    );
    // -m 256M at the virt RAM base.
    let mem = fdt.memory_regions().unwrap();
    assert_eq!(mem.as_slice(), &[MemRegion::new(0x4000_0000, 256 << 20)]);
    assert_eq!(fdt.psci_conduit().unwrap(), Some(Conduit::Hvc));

    let uart = fdt.find_compatible("arm,pl011").unwrap().unwrap();
    assert_eq!(uart.name(), "pl011@9000000");
    let regs: Vec<_> = uart.reg().unwrap().map(Result::unwrap).collect();
    assert_eq!(regs, [MemRegion::new(0x0900_0000, 0x1000)]);

    let smmu = fdt.find_compatible("arm,smmu-v3").unwrap().unwrap();
    let regs: Vec<_> = smmu.reg().unwrap().map(Result::unwrap).collect();
    assert_eq!(regs, [MemRegion::new(0x0905_0000, 0x2_0000)]);

    let pcie = fdt
        .find_compatible("pci-host-ecam-generic")
        .unwrap()
        .unwrap();
    assert_eq!(pcie.depth(), 1);
    assert_eq!(
        pcie.parent_cells(),
        Cells {
            address: 2,
            size: 2
        }
    );
    assert_eq!(
        pcie.cells(),
        Cells {
            address: 3,
            size: 2
        }
    );
    assert_eq!(pcie.property_str("device_type"), Some("pci"));
    let regs: Vec<_> = pcie.reg().unwrap().map(Result::unwrap).collect();
    assert_eq!(regs, [MemRegion::new(0x40_1000_0000, 0x1000_0000)]);

    // The GIC has two reg entries (distributor, redistributors).
    let gic = fdt.find_compatible("arm,gic-v3").unwrap().unwrap();
    let regs: Vec<_> = gic.reg().unwrap().map(Result::unwrap).collect();
    assert_eq!(
        regs,
        [
            MemRegion::new(0x0800_0000, 0x1_0000),
            MemRegion::new(0x080a_0000, 0xf6_0000)
        ]
    );
    assert!(fdt.find_compatible("no,such-device").unwrap().is_none());
}

#[test]
fn node_walk_tracks_depth_and_cells() {
    let blob = Builder::default()
        .begin("")
        .prop_cells("#address-cells", &[1])
        .prop_cells("#size-cells", &[1])
        .begin("soc")
        .word(FDT_NOP)
        .prop("compatible", b"simple-bus\0")
        .begin("uart@1000")
        .prop("compatible", b"vendor,uart\0ns16550\0")
        .prop_cells("reg", &[0x1000, 0x100])
        .end()
        .end()
        .begin("memory@80000000")
        .prop("device_type", b"memory\0")
        .prop_cells("reg", &[0x8000_0000, 0x1000_0000, 0x9000_0000, 0x100_0000])
        .end()
        .end()
        .finish();
    let fdt = Fdt::new(&blob).unwrap();
    let nodes: Vec<_> = fdt
        .nodes()
        .map(|n| n.map(|n| (n.name(), n.depth())))
        .collect::<Result<_>>()
        .unwrap();
    assert_eq!(
        nodes,
        [
            ("", 0),
            ("soc", 1),
            ("uart@1000", 2),
            ("memory@80000000", 1)
        ]
    );
    let uart = fdt.find_compatible("ns16550").unwrap().unwrap();
    // soc has no #address-cells: the defaults 2/1 apply to its children (spec 2.3.5), so a
    // two-word reg is one 2-cell address and no room for a size: malformed.
    assert_eq!(uart.parent_cells(), Cells::DEFAULT);
    assert!(uart.reg().is_err());
    let mem = fdt.memory_regions().unwrap();
    assert_eq!(
        mem.as_slice(),
        &[
            MemRegion::new(0x8000_0000, 0x1000_0000),
            MemRegion::new(0x9000_0000, 0x100_0000)
        ]
    );
    assert_eq!(fdt.psci_conduit().unwrap(), None);
}

#[test]
fn disabled_nodes_are_skipped() {
    let blob = Builder::default()
        .begin("")
        .prop_cells("#address-cells", &[1])
        .prop_cells("#size-cells", &[1])
        .begin("uart@1000")
        .prop("compatible", b"arm,pl011\0")
        .prop("status", b"disabled\0")
        .prop_cells("reg", &[0x1000, 0x100])
        .end()
        .begin("uart@2000")
        .prop("compatible", b"arm,pl011\0")
        .prop("status", b"fail-overheated\0")
        .end()
        .begin("uart@3000")
        .prop("compatible", b"arm,pl011\0")
        .prop("status", b"okay") // not NUL-terminated: malformed
        .end()
        .begin("uart@4000")
        .prop("compatible", b"arm,pl011\0")
        .prop("status", b"ok\0")
        .prop_cells("reg", &[0x4000, 0x100])
        .end()
        .begin("memory@80000000")
        .prop("device_type", b"memory\0")
        .prop("status", b"reserved\0")
        .prop_cells("reg", &[0x8000_0000, 0x1000_0000])
        .end()
        .begin("memory@90000000")
        .prop("device_type", b"memory\0")
        .prop_cells("reg", &[0x9000_0000, 0x100_0000])
        .end()
        .end()
        .finish();
    let fdt = Fdt::new(&blob).unwrap();
    let uart = fdt.find_compatible("arm,pl011").unwrap().unwrap();
    assert_eq!(uart.name(), "uart@4000");
    assert_eq!(
        fdt.memory_regions().unwrap().as_slice(),
        &[MemRegion::new(0x9000_0000, 0x100_0000)]
    );
}

#[test]
fn header_errors_are_typed() {
    assert_eq!(
        Fdt::new(&VIRT_DTB[..39]).unwrap_err(),
        FirmwareError::FdtTruncated { len: 39 }
    );
    let mut bad = VIRT_DTB.to_vec();
    bad[0] = 0;
    assert_eq!(
        Fdt::new(&bad).unwrap_err(),
        FirmwareError::FdtBadMagic { found: 0x000d_feed }
    );
    // totalsize larger than the buffer.
    let short = &VIRT_DTB[..VIRT_DTB.len() - 8];
    assert!(matches!(
        Fdt::new(short),
        Err(FirmwareError::FdtTruncated { .. })
    ));
    // A version-1 tree.
    let mut old = VIRT_DTB.to_vec();
    old[20..24].copy_from_slice(&1u32.to_be_bytes());
    assert_eq!(
        Fdt::new(&old).unwrap_err(),
        FirmwareError::FdtVersion {
            version: 1,
            last_compatible: 16
        }
    );
    // Strings block past the end.
    let mut strings = VIRT_DTB.to_vec();
    strings[32..36].copy_from_slice(&0x10_0000u32.to_be_bytes());
    assert!(matches!(
        Fdt::new(&strings),
        Err(FirmwareError::FdtTruncated { .. })
    ));
    assert_eq!(Fdt::total_size(VIRT_DTB).unwrap(), VIRT_DTB.len());
}

#[test]
fn structure_errors_are_typed() {
    // Unbalanced: FDT_END inside a node.
    let blob = Builder::default().begin("").finish();
    let r: Result<Vec<_>> = Fdt::new(&blob).unwrap().nodes().collect();
    assert!(matches!(r, Err(FirmwareError::FdtMalformed { .. })));

    // A second root node (the structure block has exactly one, Devicetree 5.4.2): it could
    // smuggle in memory nodes.
    let blob = Builder::default()
        .begin("")
        .end()
        .begin("")
        .begin("memory@0")
        .prop("device_type", b"memory\0")
        .end()
        .end()
        .finish();
    let r: Result<Vec<_>> = Fdt::new(&blob).unwrap().nodes().collect();
    assert!(
        matches!(r, Err(FirmwareError::FdtMalformed { .. })),
        "{r:?}"
    );

    // END_NODE without BEGIN_NODE.
    let blob = Builder::default().end().finish();
    let r: Result<Vec<_>> = Fdt::new(&blob).unwrap().nodes().collect();
    assert!(matches!(r, Err(FirmwareError::FdtMalformed { offset: 0 })));

    // Property name offset outside the strings block.
    let mut b = Builder::default();
    b.begin("").word(FDT_PROP).word(0).word(0x1000).end();
    let blob = b.finish();
    let r: Result<Vec<_>> = Fdt::new(&blob).unwrap().nodes().collect();
    assert!(matches!(r, Err(FirmwareError::FdtMalformed { .. })));

    // Property longer than the structure block.
    let mut b = Builder::default();
    b.begin("").prop("x", b"").end();
    let mut blob = b.finish();
    let len_at = HEADER_SIZE + 16 + 8 + 4; // BEGIN_NODE + "\0" pad, then PROP, len
    blob[len_at..len_at + 4].copy_from_slice(&0xffff_fff0u32.to_be_bytes());
    let r: Result<Vec<_>> = Fdt::new(&blob).unwrap().nodes().collect();
    assert!(matches!(r, Err(FirmwareError::FdtMalformed { .. })));

    // Nesting deeper than MAX_DEPTH.
    let mut b = Builder::default();
    for _ in 0..=MAX_DEPTH {
        b.begin("n");
    }
    for _ in 0..=MAX_DEPTH {
        b.end();
    }
    let blob = b.finish();
    let r: Result<Vec<_>> = Fdt::new(&blob).unwrap().nodes().collect();
    assert!(matches!(r, Err(FirmwareError::FdtMalformed { .. })));

    // Unknown PSCI method.
    let blob = Builder::default()
        .begin("")
        .begin("psci")
        .prop("compatible", b"arm,psci-1.0\0")
        .prop("method", b"svc\0")
        .end()
        .end()
        .finish();
    assert_eq!(
        Fdt::new(&blob).unwrap().psci_conduit(),
        Err(FirmwareError::FdtBadProperty { name: "method" })
    );
}

#[test]
fn property_accessors_check_lengths() {
    let blob = Builder::default()
        .begin("")
        .prop_cells("one", &[7])
        .prop_cells("two", &[1, 2])
        .prop("text", b"abc\0")
        .prop("raw", b"abc")
        .end()
        .finish();
    let fdt = Fdt::new(&blob).unwrap();
    let root = fdt.nodes().next().unwrap().unwrap();
    assert_eq!(root.property_u32("one"), Ok(Some(7)));
    assert_eq!(
        root.property_u32("two"),
        Err(FirmwareError::FdtBadProperty { name: "two" })
    );
    assert_eq!(root.property_u32("absent"), Ok(None));
    assert_eq!(root.property_str("text"), Some("abc"));
    assert_eq!(root.property_str("raw"), None, "not NUL-terminated");
    assert_eq!(
        read_cells(&[0, 0, 0, 1, 0, 0, 0, 2], 0, 2),
        Some(0x1_0000_0002)
    );
    assert_eq!(read_cells(&[0; 12], 0, 3), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Corrupting any bytes of a real tree gives a typed error or a tree, never a panic,
    /// and the walk always terminates.
    #[test]
    fn corrupted_trees_never_panic(
        edits in proptest::collection::vec((0..VIRT_DTB.len(), any::<u8>()), 1..8),
        cut in 0..VIRT_DTB.len(),
        truncate in any::<bool>(),
    ) {
        let mut blob = VIRT_DTB.to_vec();
        for (at, byte) in edits {
            blob[at] = byte;
        }
        if truncate {
            blob.truncate(cut);
        }
        if let Ok(fdt) = Fdt::new(&blob) {
            let mut count = 0usize;
            for node in fdt.nodes() {
                let Ok(node) = node else { break };
                let _ = node.reg().map(|r| r.count());
                let _ = node.properties().count();
                count += 1;
                prop_assert!(count <= blob.len() / 8, "walk must advance");
            }
            let _ = fdt.memory_regions();
            let _ = fdt.psci_conduit();
        }
    }
}
