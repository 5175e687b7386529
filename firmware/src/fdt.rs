//! A small read-only parser for flattened device trees (DTB), enough to find nodes by
//! `compatible`, read their properties and decode `reg`.
//!
//! Format from the *Devicetree Specification* v0.4, chapter 5 ("Flattened Devicetree (DTB)
//! Format"): a 40-byte big-endian header (5.2), a structure block of 4-byte-aligned tokens
//! (5.4) and a strings block of NUL-terminated property names (5.5). Cell defaults from 2.3.5.
//!
//! The parser reads the blob only through bounds-checked byte accesses, so it may run before
//! the MMU is on (where every data access is Device memory and must be aligned), and it
//! never panics on malformed input: every inconsistency is a [`FirmwareError`].

use crate::error::{FirmwareError, Result};
use crate::platform::{Conduit, MemRegion};

/// The header magic (5.2).
pub const MAGIC: u32 = 0xd00d_feed;
/// Size of the header in bytes (5.2, version 17).
pub const HEADER_SIZE: usize = 40;
/// Deepest node nesting the parser follows.
pub const MAX_DEPTH: usize = 16;
/// How many memory regions [`Fdt::memory_regions`] returns at most.
pub const MAX_MEMORY_REGIONS: usize = 8;

const FDT_BEGIN_NODE: u32 = 0x1;
const FDT_END_NODE: u32 = 0x2;
const FDT_PROP: u32 = 0x3;
const FDT_NOP: u32 = 0x4;
const FDT_END: u32 = 0x9;

/// Big-endian u32 at `at`, by bytes (no alignment assumption).
fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

const fn align4(x: usize) -> Option<usize> {
    match x.checked_add(3) {
        Some(v) => Some(v & !3),
        None => None,
    }
}

/// Position of the first NUL at or after `from`.
fn nul_from(bytes: &[u8], from: usize) -> Option<usize> {
    let rest = bytes.get(from..)?;
    rest.iter().position(|&b| b == 0).map(|p| from + p)
}

/// Reads a 1- or 2-cell number starting at byte `at`.
pub fn read_cells(bytes: &[u8], at: usize, cells: u32) -> Option<u64> {
    match cells {
        1 => be32(bytes, at).map(u64::from),
        2 => {
            let hi = be32(bytes, at)?;
            let lo = be32(bytes, at.checked_add(4)?)?;
            Some((u64::from(hi) << 32) | u64::from(lo))
        }
        _ => None,
    }
}

/// `#address-cells` / `#size-cells` of a node (the cells its children's `reg` use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cells {
    /// `#address-cells`.
    pub address: u32,
    /// `#size-cells`.
    pub size: u32,
}

impl Cells {
    /// The defaults when a node has no `#address-cells`/`#size-cells` (2.3.5): 2 and 1.
    pub const DEFAULT: Cells = Cells {
        address: 2,
        size: 1,
    };
}

/// A parsed device-tree blob.
#[derive(Clone, Copy)]
pub struct Fdt<'a> {
    blob: &'a [u8],
    structs: &'a [u8],
    strings: &'a [u8],
}

impl core::fmt::Debug for Fdt<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The blob itself would be a megabyte of numbers.
        f.debug_struct("Fdt")
            .field("total_size", &self.blob.len())
            .field("structure_block", &self.structs.len())
            .field("strings_block", &self.strings.len())
            .finish()
    }
}

impl<'a> Fdt<'a> {
    /// Checks the magic in the first bytes of a blob and returns its `totalsize`, so a caller
    /// holding only a pointer can learn how many bytes to look at.
    pub fn total_size(header: &[u8]) -> Result<usize> {
        let magic = be32(header, 0).ok_or(FirmwareError::FdtTruncated { len: header.len() })?;
        if magic != MAGIC {
            return Err(FirmwareError::FdtBadMagic { found: magic });
        }
        let total = be32(header, 4).ok_or(FirmwareError::FdtTruncated { len: header.len() })?;
        Ok(total as usize)
    }

    /// Validates the header and the block bounds of `blob` (which may be longer than the
    /// tree: only `totalsize` bytes are used).
    pub fn new(blob: &'a [u8]) -> Result<Self> {
        let truncated = FirmwareError::FdtTruncated { len: blob.len() };
        if blob.len() < HEADER_SIZE {
            return Err(truncated);
        }
        let total = Self::total_size(blob)?;
        let blob = blob.get(..total).ok_or(truncated)?;
        let field = |at| be32(blob, at).ok_or(truncated);
        let off_struct = field(8)? as usize;
        let off_strings = field(12)? as usize;
        let version = field(20)?;
        let last_compatible = field(24)?;
        let size_strings = field(32)? as usize;
        // Version 16 trees have no size_dt_struct; 17 is current and backward compatible
        // with 16 (5.2).
        if version < 16 || last_compatible > 17 {
            return Err(FirmwareError::FdtVersion {
                version,
                last_compatible,
            });
        }
        let size_struct = if version >= 17 {
            field(36)? as usize
        } else {
            total.saturating_sub(off_struct)
        };
        let block = |off: usize, size: usize| {
            off.checked_add(size)
                .and_then(|end| blob.get(off..end))
                .ok_or(truncated)
        };
        Ok(Self {
            blob,
            structs: block(off_struct, size_struct)?,
            strings: block(off_strings, size_strings)?,
        })
    }

    /// The blob (`totalsize` bytes).
    pub fn as_bytes(&self) -> &'a [u8] {
        self.blob
    }

    /// All nodes in document order (depth first).
    pub fn nodes(&self) -> Nodes<'a> {
        Nodes {
            fdt: *self,
            offset: 0,
            open: heapless::Vec::new(),
            done: false,
            root_seen: false,
        }
    }

    /// The first available node ([`Node::is_available`]) whose `compatible` list contains
    /// `compatible`.
    pub fn find_compatible(&self, compatible: &str) -> Result<Option<Node<'a>>> {
        for node in self.nodes() {
            let node = node?;
            if node.is_compatible(compatible) && node.is_available() {
                return Ok(Some(node));
            }
        }
        Ok(None)
    }

    /// The `reg` ranges of every available node with `device_type = "memory"` (at most
    /// [`MAX_MEMORY_REGIONS`]; further ones are not returned).
    pub fn memory_regions(&self) -> Result<heapless::Vec<MemRegion, MAX_MEMORY_REGIONS>> {
        let mut out = heapless::Vec::new();
        for node in self.nodes() {
            let node = node?;
            if node.property_str("device_type") != Some("memory") || !node.is_available() {
                continue;
            }
            for region in node.reg()? {
                if out.push(region?).is_err() {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// The PSCI conduit named by the `/psci` node's `method` (Linux binding
    /// `arm,psci`), if there is such a node.
    pub fn psci_conduit(&self) -> Result<Option<Conduit>> {
        for node in self.nodes() {
            let node = node?;
            if !node.compatible().any(|c| c.starts_with("arm,psci")) {
                continue;
            }
            return match node.property_str("method") {
                Some("hvc") => Ok(Some(Conduit::Hvc)),
                Some("smc") => Ok(Some(Conduit::Smc)),
                _ => Err(FirmwareError::FdtBadProperty { name: "method" }),
            };
        }
        Ok(None)
    }

    /// The property name at `nameoff` in the strings block.
    fn string_at(&self, nameoff: usize) -> Option<&'a [u8]> {
        let end = nul_from(self.strings, nameoff)?;
        self.strings.get(nameoff..end)
    }
}

/// Iterator over the nodes of a tree; see [`Fdt::nodes`]. After an error it ends.
pub struct Nodes<'a> {
    fdt: Fdt<'a>,
    offset: usize,
    /// The cells of every node open at `offset`, root first (its length is the depth).
    open: heapless::Vec<Cells, MAX_DEPTH>,
    done: bool,
    /// The root node was read: the structure block has exactly one (Devicetree 5.4.2).
    root_seen: bool,
}

impl<'a> Nodes<'a> {
    fn malformed(&mut self, offset: usize) -> Option<Result<Node<'a>>> {
        self.done = true;
        Some(Err(FirmwareError::FdtMalformed { offset }))
    }

    /// Parses a node header at `self.offset` (just after its FDT_BEGIN_NODE token).
    fn begin_node(&mut self, token_at: usize) -> Option<Result<Node<'a>>> {
        let s = self.fdt.structs;
        let name_at = token_at + 4;
        let Some(name_end) = nul_from(s, name_at) else {
            return self.malformed(name_at);
        };
        let name = s.get(name_at..name_end).unwrap_or_default();
        let Some(mut at) = align4(name_end + 1) else {
            return self.malformed(name_end);
        };
        let props_start = at;
        let mut own = Cells::DEFAULT;
        // Properties come before subnodes (5.4.1); read them now for the cells.
        loop {
            match be32(s, at) {
                Some(FDT_NOP) => at += 4,
                Some(FDT_PROP) => {
                    let (Some(len), Some(nameoff)) = (be32(s, at + 4), be32(s, at + 8)) else {
                        return self.malformed(at);
                    };
                    let value_at = at + 12;
                    let Some(value_end) = value_at.checked_add(len as usize) else {
                        return self.malformed(at);
                    };
                    if value_end > s.len() {
                        return self.malformed(at);
                    }
                    let Some(prop_name) = self.fdt.string_at(nameoff as usize) else {
                        return self.malformed(at);
                    };
                    let value = s.get(value_at..value_end).unwrap_or_default();
                    match (prop_name, value.len()) {
                        (b"#address-cells", 4) => own.address = be32(value, 0).unwrap_or(2),
                        (b"#size-cells", 4) => own.size = be32(value, 0).unwrap_or(1),
                        _ => {}
                    }
                    let Some(next) = align4(value_end) else {
                        return self.malformed(at);
                    };
                    at = next;
                }
                Some(_) => break,
                None => return self.malformed(at),
            }
        }
        let parent = self.open.last().copied().unwrap_or(Cells::DEFAULT);
        let depth = self.open.len();
        if self.open.push(own).is_err() {
            // Deeper than MAX_DEPTH.
            return self.malformed(token_at);
        }
        let node = Node {
            fdt: self.fdt,
            name,
            depth,
            props_start,
            props_end: at,
            parent_cells: parent,
            cells: own,
        };
        self.offset = at;
        Some(Ok(node))
    }
}

impl<'a> Iterator for Nodes<'a> {
    type Item = Result<Node<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        loop {
            let at = self.offset;
            match be32(self.fdt.structs, at) {
                Some(FDT_BEGIN_NODE) if self.open.is_empty() && self.root_seen => {
                    // A second top-level node.
                    return self.malformed(at);
                }
                Some(FDT_BEGIN_NODE) => {
                    self.root_seen |= self.open.is_empty();
                    return self.begin_node(at);
                }
                Some(FDT_END_NODE) => {
                    if self.open.pop().is_none() {
                        return self.malformed(at);
                    }
                    self.offset = at + 4;
                }
                Some(FDT_NOP) => self.offset = at + 4,
                Some(FDT_END) => {
                    self.done = true;
                    return if self.open.is_empty() {
                        None
                    } else {
                        self.malformed(at)
                    };
                }
                // A property after a subnode, an unknown token, or the end of the block
                // without FDT_END.
                _ => return self.malformed(at),
            }
        }
    }
}

/// One node of a tree.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    fdt: Fdt<'a>,
    name: &'a [u8],
    depth: usize,
    props_start: usize,
    props_end: usize,
    parent_cells: Cells,
    cells: Cells,
}

impl<'a> Node<'a> {
    /// The node name including the unit address (`pcie@10000000`); empty for the root, `?`
    /// if it is not UTF-8.
    pub fn name(&self) -> &'a str {
        core::str::from_utf8(self.name).unwrap_or("?")
    }

    /// Nesting depth (the root is 0).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The cells of the parent, which this node's `reg` uses.
    pub fn parent_cells(&self) -> Cells {
        self.parent_cells
    }

    /// This node's own `#address-cells`/`#size-cells` (for its children and its `ranges`).
    pub fn cells(&self) -> Cells {
        self.cells
    }

    /// All properties as (name, value) pairs.
    pub fn properties(&self) -> Properties<'a> {
        Properties {
            fdt: self.fdt,
            at: self.props_start,
            end: self.props_end,
        }
    }

    /// The value of property `name`.
    pub fn property(&self, name: &str) -> Option<&'a [u8]> {
        self.properties()
            .find(|(n, _)| *n == name.as_bytes())
            .map(|(_, v)| v)
    }

    /// A string property (without its terminating NUL), if it is one.
    pub fn property_str(&self, name: &str) -> Option<&'a str> {
        let value = self.property(name)?;
        let text = value.strip_suffix(&[0])?;
        core::str::from_utf8(text).ok()
    }

    /// The entries of the `compatible` string list (none if absent or not UTF-8).
    pub fn compatible(&self) -> impl Iterator<Item = &'a str> + use<'a> {
        self.property("compatible")
            .unwrap_or_default()
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .filter_map(|s| core::str::from_utf8(s).ok())
    }

    /// Whether the node is usable: its `status` is `"okay"` (or the older `"ok"`), or absent
    /// (Devicetree Specification v0.4 §2.3.4; `"disabled"`, `"reserved"`, `"fail"` and a
    /// malformed status are not to be used).
    pub fn is_available(&self) -> bool {
        match self.property("status") {
            None => true,
            Some(_) => matches!(self.property_str("status"), Some("okay" | "ok")),
        }
    }

    /// Whether `compatible` lists `value`.
    pub fn is_compatible(&self, value: &str) -> bool {
        self.compatible().any(|c| c == value)
    }

    /// A `<u32>` property.
    pub fn property_u32(&self, name: &'static str) -> Result<Option<u32>> {
        match self.property(name) {
            None => Ok(None),
            Some(v) if v.len() == 4 => Ok(be32(v, 0)),
            Some(_) => Err(FirmwareError::FdtBadProperty { name }),
        }
    }

    /// The `reg` entries, decoded with the parent's cells (1 or 2 cells each).
    pub fn reg(&self) -> Result<RegEntries<'a>> {
        let data = self.property("reg").unwrap_or_default();
        let Cells { address, size } = self.parent_cells;
        let entry = (address as usize + size as usize) * 4;
        if !(1..=2).contains(&address)
            || size > 2
            || entry == 0
            || !data.len().is_multiple_of(entry)
        {
            return Err(FirmwareError::FdtBadProperty { name: "reg" });
        }
        Ok(RegEntries {
            data,
            at: 0,
            cells: self.parent_cells,
        })
    }
}

/// Iterator over a node's properties; malformed data ends it (the node header was validated
/// when the node was found, so that does not happen for nodes from [`Fdt::nodes`]).
pub struct Properties<'a> {
    fdt: Fdt<'a>,
    at: usize,
    end: usize,
}

impl<'a> Iterator for Properties<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let s = self.fdt.structs;
        while self.at < self.end {
            match be32(s, self.at)? {
                FDT_NOP => self.at += 4,
                FDT_PROP => {
                    let len = be32(s, self.at + 4)? as usize;
                    let nameoff = be32(s, self.at + 8)? as usize;
                    let value_at = self.at + 12;
                    let value = s.get(value_at..value_at.checked_add(len)?)?;
                    let name = self.fdt.string_at(nameoff)?;
                    self.at = align4(value_at + len)?;
                    return Some((name, value));
                }
                _ => return None,
            }
        }
        None
    }
}

/// Iterator over `reg` entries; see [`Node::reg`].
pub struct RegEntries<'a> {
    data: &'a [u8],
    at: usize,
    cells: Cells,
}

impl Iterator for RegEntries<'_> {
    type Item = Result<MemRegion>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.data.len() {
            return None;
        }
        let base = read_cells(self.data, self.at, self.cells.address);
        let size_at = self.at + self.cells.address as usize * 4;
        let size = if self.cells.size == 0 {
            Some(0)
        } else {
            read_cells(self.data, size_at, self.cells.size)
        };
        self.at = size_at + self.cells.size as usize * 4;
        Some(match (base, size) {
            (Some(base), Some(size)) => Ok(MemRegion::new(base, size)),
            _ => Err(FirmwareError::FdtBadProperty { name: "reg" }),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
