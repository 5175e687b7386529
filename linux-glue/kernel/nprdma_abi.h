/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The nprdma kernel-module ABI, in C. This header mirrors linux-glue/src/abi.rs field for
 * field; the _Static_asserts below pin the same sizes and offsets as the `const` assertions
 * there, and linux-glue's test `kernel_abi_header` compiles this header in user space and
 * compares every number with the Rust side. A layout change is an ABI break and needs
 * NPRDMA_ABI_VERSION + 1 on both sides.
 *
 * Usable from the module (__KERNEL__) and from user space (needs <linux/types.h> and
 * <linux/ioctl.h>, Debian's linux-libc-dev).
 */
#ifndef NPRDMA_ABI_H
#define NPRDMA_ABI_H

#include <linux/types.h>
#include <linux/ioctl.h>
#ifdef __KERNEL__
#include <linux/stddef.h>
#else
#include <stddef.h>
#endif

#define NPRDMA_ABI_VERSION 4u
/* The misc device's name: the node is /dev/nprdma-glue (abi.rs DEVICE_NODE). */
#define NPRDMA_DEVICE_NAME "nprdma-glue"
/* Unassigned in Documentation/userspace-api/ioctl/ioctl-number.rst as read. */
#define NPRDMA_IOCTL_MAGIC 0xD7

/* Leads every ioctl argument. */
struct nprdma_abi_header {
	__u32 abi_version; /* NPRDMA_ABI_VERSION of the caller */
	__u32 struct_size; /* sizeof the whole argument as the caller knows it */
};

/* IOC_VERSION: handshake. Answered whatever the caller's version. */
struct nprdma_version_args {
	struct nprdma_abi_header hdr;
	__u32 module_version; /* out */
	__u32 features;       /* out: NPRDMA_FEATURE_* */
};

#define NPRDMA_FEATURE_HUGE (1u << 0)    /* fault-in and resolve report 2 MiB blocks */
#define NPRDMA_FEATURE_RING (1u << 1)    /* the invalidation ring exists */
#define NPRDMA_FEATURE_RESOLVE (1u << 2) /* IOC_RESOLVE returns frames */
#define NPRDMA_FEATURE_DMA (1u << 3)     /* IOC_DMA_ATTACH and IOC_DMA (ABI 3) */

#define NPRDMA_ACCESS_READ 1u
#define NPRDMA_ACCESS_WRITE 2u

/* IOC_REGISTER: register [addr, addr + len) without pinning. */
struct nprdma_register_args {
	struct nprdma_abi_header hdr;
	__u64 addr;          /* 4 KiB aligned */
	__u64 len;           /* multiple of 4 KiB */
	__u32 access;        /* NPRDMA_ACCESS_* */
	__u32 flags;         /* 0 */
	__u64 region_id;     /* out: never 0; the existing region on status 7 */
	__u64 table_offset;  /* out: mmap offset of the page-state table */
	__u64 table_entries; /* out: pages */
	__u32 status;        /* out: 0 or a GlueError code */
	__u32 reserved;
};

/* IOC_UNREGISTER. */
struct nprdma_unregister_args {
	struct nprdma_abi_header hdr;
	__u64 region_id;
	__u32 status; /* out */
	__u32 reserved;
};

#define NPRDMA_FAULT_IN_QUERY_ONLY (1u << 0)

/* IOC_FAULT_IN: fault in [addr, addr + len) of a region and mark it in the table. */
struct nprdma_fault_in_args {
	struct nprdma_abi_header hdr;
	__u64 region_id;
	__u64 addr;
	__u64 len;
	__u32 access;
	__u32 flags;        /* NPRDMA_FAULT_IN_* */
	__u64 pages_mapped; /* out */
	__u32 minor_faults; /* out */
	__u32 major_faults; /* out */
	__u32 huge_blocks;  /* out */
	__u32 status;       /* out */
};

/* IOC_RING_SETUP: the invalidation ring of this open file. */
struct nprdma_ring_setup_args {
	struct nprdma_abi_header hdr;
	__u32 entries;     /* a power of two, 1 to 65536 */
	__u32 flags;       /* 0 */
	__u64 ring_offset; /* out */
	__u64 ring_bytes;  /* out: header + records */
	__u32 status;      /* out */
	__u32 reserved;
};

/* Resolve kinds (nprdma_resolve_args.kind). */
#define NPRDMA_KIND_PRESENT 0u /* no fault was needed */
#define NPRDMA_KIND_MINOR 1u
#define NPRDMA_KIND_MAJOR 2u
#define NPRDMA_KIND_ABSENT 3u /* query only: not mapped by the CPU */

/* IOC_RESOLVE (ABI 2): one page's frame, for an SMMU or a NIC to map. */
struct nprdma_resolve_args {
	struct nprdma_abi_header hdr;
	__u64 region_id;
	__u64 addr;          /* 4 KiB aligned, inside the region */
	__u32 access;
	__u32 flags;         /* NPRDMA_FAULT_IN_QUERY_ONLY */
	__u64 pfn;           /* out: frame of mapping_start */
	__u64 mapping_start; /* out: the page, or its 2 MiB block (order 9) */
	__u32 order;         /* out: 0 (4 KiB) or 9 (2 MiB) */
	__u32 kind;          /* out: NPRDMA_KIND_* */
	__u32 version;       /* out: the page's table version afterwards */
	__u32 status;        /* out */
};

/*
 * IOC_DMA_ATTACH (ABI 3): the module's DMA device in an IOMMU domain of this open file, IOVA =
 * virtual address. Errnos: ENODEV (no device bound, or none behind an IOMMU), EBUSY (another
 * open file holds it), EALREADY (this one does).
 */
struct nprdma_dma_attach_args {
	struct nprdma_abi_header hdr;
	__u32 flags;          /* 0 */
	__u32 status;         /* out */
	__u64 pgsize_bitmap;  /* out: the domain's page sizes */
	__u64 aperture_end;   /* out: the last IOVA the domain translates */
	__u32 pci_address;    /* out: domain << 16 | bus << 8 | devfn */
	__u32 reserved;
};

#define NPRDMA_DMA_TO_DEVICE 1u   /* the device reads memory */
#define NPRDMA_DMA_FROM_DEVICE 2u /* the device writes memory */
#define NPRDMA_DMA_BUFFER_BYTES 4096u

/*
 * IOC_DMA (ABI 3): one transfer between [addr, addr + len) of a region and the device's buffer,
 * waited for on the device's interrupt. Errnos: ENODEV, ENOTCONN (not attached), ETIMEDOUT,
 * EINTR (fatal signal; the module waits for the transfer before unmapping anything).
 */
struct nprdma_dma_args {
	struct nprdma_abi_header hdr;
	__u64 region_id;
	__u64 addr;              /* IOVA = virtual address, any alignment */
	__u32 len;               /* 1 to NPRDMA_DMA_BUFFER_BYTES */
	__u32 direction;         /* NPRDMA_DMA_* */
	__u32 dev_offset;        /* in the device's buffer */
	__u32 flags;             /* 0 */
	__u32 pages;             /* out: 1 or 2 */
	__u32 present_before;    /* out: bit i = page i present at the start */
	__u32 version_before[2]; /* out */
	__u32 version_after[2];  /* out */
	__u64 elapsed_ns;        /* out */
	__u32 stale;             /* out: 1 = may have used the scratch page: re-send */
	__u32 status;            /* out */
};

/* The event ring's header; producer and consumer each on a 64-byte line of its own. */
struct nprdma_ring_header {
	struct nprdma_abi_header hdr;
	__u32 entries;
	__u32 entry_size;
	__u64 dropped; /* module writes */
	__u64 reserved0[5];
	__u64 producer; /* module writes (release) */
	__u64 reserved1[7];
	__u64 consumer; /* user space writes (release) */
	__u64 reserved2[7];
};

/* Invalidation causes (nprdma_invalidation_record.cause). 1-6 are the user-space glue's. */
#define NPRDMA_CAUSE_REMOVED 1u
#define NPRDMA_CAUSE_UNMAPPED 2u      /* MMU_NOTIFY_UNMAP: munmap, mremap */
#define NPRDMA_CAUSE_REMAPPED 3u
#define NPRDMA_CAUSE_SWAPPED_OUT 4u
#define NPRDMA_CAUSE_DROPPED 5u
#define NPRDMA_CAUSE_FRAME_CHANGED 6u /* MMU_NOTIFY_MIGRATE (migrate_vma) */
#define NPRDMA_CAUSE_CLEARED 7u       /* MMU_NOTIFY_CLEAR (madvise, reclaim, migration, COW) */
#define NPRDMA_CAUSE_PROTECTION 8u    /* MMU_NOTIFY_PROTECTION_*, SOFT_DIRTY */
#define NPRDMA_CAUSE_RELEASED 9u      /* MMU_NOTIFY_RELEASE: the mm is gone */
#define NPRDMA_CAUSE_DEVICE_FAULT 10u /* ABI 4: an IOMMU fault (start = IOVA, new_start = RID) */

/* Record flags. */
#define NPRDMA_RECORD_NONBLOCKING (1u << 0) /* from a non-blockable invalidation */
#define NPRDMA_RECORD_DEVICE_WRITE (1u << 1) /* ABI 4: the faulting access was a write */

struct nprdma_invalidation_record {
	__u64 seq;
	__u64 region_id;
	__u64 start;
	__u64 len;
	__u32 cause;
	__u32 flags;
	__u64 new_start;
};

/* A region's page-state table: this header, then one __u64 per 4 KiB page. */
struct nprdma_table_header {
	struct nprdma_abi_header hdr;
	__u64 region_id;
	__u64 entries;
	__u64 generation;
};

#define NPRDMA_ENTRY_PRESENT (1ull << 0)
#define NPRDMA_ENTRY_WRITABLE (1ull << 1)
#define NPRDMA_ENTRY_HUGE (1ull << 2)
#define NPRDMA_ENTRY_VERSION_SHIFT 32

#define NPRDMA_IOC_VERSION _IOWR(NPRDMA_IOCTL_MAGIC, 0x00, struct nprdma_version_args)
#define NPRDMA_IOC_REGISTER _IOWR(NPRDMA_IOCTL_MAGIC, 0x01, struct nprdma_register_args)
#define NPRDMA_IOC_UNREGISTER _IOWR(NPRDMA_IOCTL_MAGIC, 0x02, struct nprdma_unregister_args)
#define NPRDMA_IOC_FAULT_IN _IOWR(NPRDMA_IOCTL_MAGIC, 0x03, struct nprdma_fault_in_args)
#define NPRDMA_IOC_RING_SETUP _IOWR(NPRDMA_IOCTL_MAGIC, 0x04, struct nprdma_ring_setup_args)
#define NPRDMA_IOC_RESOLVE _IOWR(NPRDMA_IOCTL_MAGIC, 0x05, struct nprdma_resolve_args)
#define NPRDMA_IOC_DMA_ATTACH _IOWR(NPRDMA_IOCTL_MAGIC, 0x06, struct nprdma_dma_attach_args)
#define NPRDMA_IOC_DMA _IOWR(NPRDMA_IOCTL_MAGIC, 0x07, struct nprdma_dma_args)

/* Status codes: linux-glue's GlueError::code() values. */
#define NPRDMA_ST_OK 0u
#define NPRDMA_ST_MISALIGNED 1u
#define NPRDMA_ST_OVERFLOW 2u
#define NPRDMA_ST_EMPTY 3u
#define NPRDMA_ST_UNMAPPED 4u
#define NPRDMA_ST_NOT_WRITABLE 5u
#define NPRDMA_ST_NOT_READABLE 6u
#define NPRDMA_ST_ALREADY_REGISTERED 7u
#define NPRDMA_ST_UNKNOWN_REGION 8u
#define NPRDMA_ST_NOT_REGISTERED 9u
#define NPRDMA_ST_REGION_GONE 10u
#define NPRDMA_ST_UNSUPPORTED 11u
#define NPRDMA_ST_CONTENDED 20u
#define NPRDMA_ST_INVALID 21u
#define NPRDMA_ST_HWPOISON 22u

/* The layout pins of abi.rs. */
#define NPRDMA_PIN(type, field, off) _Static_assert(offsetof(type, field) == (off), #type "." #field)
#define NPRDMA_SIZE(type, size) _Static_assert(sizeof(type) == (size), "sizeof " #type)

NPRDMA_SIZE(struct nprdma_abi_header, 8);
NPRDMA_SIZE(struct nprdma_version_args, 16);
NPRDMA_PIN(struct nprdma_version_args, module_version, 8);
NPRDMA_PIN(struct nprdma_version_args, features, 12);
NPRDMA_SIZE(struct nprdma_register_args, 64);
NPRDMA_PIN(struct nprdma_register_args, addr, 8);
NPRDMA_PIN(struct nprdma_register_args, len, 16);
NPRDMA_PIN(struct nprdma_register_args, access, 24);
NPRDMA_PIN(struct nprdma_register_args, flags, 28);
NPRDMA_PIN(struct nprdma_register_args, region_id, 32);
NPRDMA_PIN(struct nprdma_register_args, table_offset, 40);
NPRDMA_PIN(struct nprdma_register_args, table_entries, 48);
NPRDMA_PIN(struct nprdma_register_args, status, 56);
NPRDMA_SIZE(struct nprdma_unregister_args, 24);
NPRDMA_PIN(struct nprdma_unregister_args, region_id, 8);
NPRDMA_PIN(struct nprdma_unregister_args, status, 16);
NPRDMA_SIZE(struct nprdma_fault_in_args, 64);
NPRDMA_PIN(struct nprdma_fault_in_args, region_id, 8);
NPRDMA_PIN(struct nprdma_fault_in_args, addr, 16);
NPRDMA_PIN(struct nprdma_fault_in_args, len, 24);
NPRDMA_PIN(struct nprdma_fault_in_args, access, 32);
NPRDMA_PIN(struct nprdma_fault_in_args, flags, 36);
NPRDMA_PIN(struct nprdma_fault_in_args, pages_mapped, 40);
NPRDMA_PIN(struct nprdma_fault_in_args, minor_faults, 48);
NPRDMA_PIN(struct nprdma_fault_in_args, major_faults, 52);
NPRDMA_PIN(struct nprdma_fault_in_args, huge_blocks, 56);
NPRDMA_PIN(struct nprdma_fault_in_args, status, 60);
NPRDMA_SIZE(struct nprdma_ring_setup_args, 40);
NPRDMA_PIN(struct nprdma_ring_setup_args, entries, 8);
NPRDMA_PIN(struct nprdma_ring_setup_args, ring_offset, 16);
NPRDMA_PIN(struct nprdma_ring_setup_args, ring_bytes, 24);
NPRDMA_PIN(struct nprdma_ring_setup_args, status, 32);
NPRDMA_SIZE(struct nprdma_resolve_args, 64);
NPRDMA_PIN(struct nprdma_resolve_args, region_id, 8);
NPRDMA_PIN(struct nprdma_resolve_args, addr, 16);
NPRDMA_PIN(struct nprdma_resolve_args, access, 24);
NPRDMA_PIN(struct nprdma_resolve_args, flags, 28);
NPRDMA_PIN(struct nprdma_resolve_args, pfn, 32);
NPRDMA_PIN(struct nprdma_resolve_args, mapping_start, 40);
NPRDMA_PIN(struct nprdma_resolve_args, order, 48);
NPRDMA_PIN(struct nprdma_resolve_args, kind, 52);
NPRDMA_PIN(struct nprdma_resolve_args, version, 56);
NPRDMA_PIN(struct nprdma_resolve_args, status, 60);
NPRDMA_SIZE(struct nprdma_ring_header, 192);
NPRDMA_PIN(struct nprdma_ring_header, entries, 8);
NPRDMA_PIN(struct nprdma_ring_header, entry_size, 12);
NPRDMA_PIN(struct nprdma_ring_header, dropped, 16);
NPRDMA_PIN(struct nprdma_ring_header, producer, 64);
NPRDMA_PIN(struct nprdma_ring_header, consumer, 128);
NPRDMA_SIZE(struct nprdma_invalidation_record, 48);
NPRDMA_PIN(struct nprdma_invalidation_record, region_id, 8);
NPRDMA_PIN(struct nprdma_invalidation_record, start, 16);
NPRDMA_PIN(struct nprdma_invalidation_record, len, 24);
NPRDMA_PIN(struct nprdma_invalidation_record, cause, 32);
NPRDMA_PIN(struct nprdma_invalidation_record, flags, 36);
NPRDMA_PIN(struct nprdma_invalidation_record, new_start, 40);
NPRDMA_SIZE(struct nprdma_table_header, 32);
NPRDMA_PIN(struct nprdma_table_header, region_id, 8);
NPRDMA_PIN(struct nprdma_table_header, entries, 16);
NPRDMA_PIN(struct nprdma_table_header, generation, 24);
NPRDMA_SIZE(struct nprdma_dma_attach_args, 40);
NPRDMA_PIN(struct nprdma_dma_attach_args, flags, 8);
NPRDMA_PIN(struct nprdma_dma_attach_args, status, 12);
NPRDMA_PIN(struct nprdma_dma_attach_args, pgsize_bitmap, 16);
NPRDMA_PIN(struct nprdma_dma_attach_args, aperture_end, 24);
NPRDMA_PIN(struct nprdma_dma_attach_args, pci_address, 32);
NPRDMA_SIZE(struct nprdma_dma_args, 80);
NPRDMA_PIN(struct nprdma_dma_args, region_id, 8);
NPRDMA_PIN(struct nprdma_dma_args, addr, 16);
NPRDMA_PIN(struct nprdma_dma_args, len, 24);
NPRDMA_PIN(struct nprdma_dma_args, direction, 28);
NPRDMA_PIN(struct nprdma_dma_args, dev_offset, 32);
NPRDMA_PIN(struct nprdma_dma_args, flags, 36);
NPRDMA_PIN(struct nprdma_dma_args, pages, 40);
NPRDMA_PIN(struct nprdma_dma_args, present_before, 44);
NPRDMA_PIN(struct nprdma_dma_args, version_before, 48);
NPRDMA_PIN(struct nprdma_dma_args, version_after, 56);
NPRDMA_PIN(struct nprdma_dma_args, elapsed_ns, 64);
NPRDMA_PIN(struct nprdma_dma_args, stale, 72);
NPRDMA_PIN(struct nprdma_dma_args, status, 76);

#endif /* NPRDMA_ABI_H */
