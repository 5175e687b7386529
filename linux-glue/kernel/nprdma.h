/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * nprdma.ko's internal header: its objects, the functions they share and the lock order.
 *
 * Objects, one file each:
 *   main.c      the character device, the context of each open file, ioctl dispatch,
 *               stats, module init/exit
 *   buf.c       memory shared with user space (tables, ring) and its mmap
 *   table.c     regions: the mmu_interval_notifier and the page-state table
 *   fault.c     fault-in and resolution (hmm_range_fault)
 *   ring.c      the invalidation ring
 *   dma.c       the IOMMU domain and the bound DMA device (edu)
 *   devfault.c  IOMMU faults forwarded to user space
 * Each file's head comment documents the locking of its objects.
 *
 * Lock order (outer first): ctx->mutex; then npg_dev_mutex or the mmap lock (never both);
 * then one spinlock. The spinlocks (region->lock, ctx->lookup_lock, ctx->ring_lock) are
 * never held together, nor around anything that sleeps or allocates but GFP_ATOMIC: the
 * invalidation callback takes region->lock, drops it, then takes ring_lock; npg_mmap (under
 * the mm's mmap lock) takes lookup_lock or ring_lock. Only ctx->ring_lock is taken in
 * interrupt context (by the IOMMU fault handler), so it is always taken with interrupts off.
 *
 * The ABI (ioctl numbers, argument layouts, table and ring layouts, status codes) is
 * nprdma_abi.h, which mirrors linux-glue/src/abi.rs.
 */
#ifndef NPRDMA_H
#define NPRDMA_H

#include <linux/errno.h>
#include <linux/fs.h>
#include <linux/hmm.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/iommu.h>
#include <linux/jiffies.h>
#include <linux/ktime.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <linux/vmalloc.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>

#include "nprdma_abi.h"

#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 1, 0)
#error "nprdma needs Linux 6.1 or newer (VMA iterator, hmm_range_fault with map orders)"
#endif

#define NPG_PAGE_SHIFT 12
#define NPG_HUGE_SHIFT 21
#define NPG_HUGE_ORDER (NPG_HUGE_SHIFT - NPG_PAGE_SHIFT)
#define NPG_HUGE_SIZE (1UL << NPG_HUGE_SHIFT)
/* Largest region: 64 GiB (a table of up to 128 MiB, held sparsely). */
#define NPG_MAX_PAGES (1UL << 24)
/* Pages per hmm_range_fault() call in IOC_FAULT_IN (a 4 KiB pfn array). */
#define NPG_CHUNK_PAGES 512UL
#define NPG_MAX_RING 65536U
/* Module-wide counters (main.c, shown by the stats file). */
extern struct workqueue_struct *npg_wq;
extern atomic_t npg_contexts;
extern atomic_t npg_regions;
extern atomic_t npg_teardowns;
extern atomic_long_t npg_retries;
extern atomic_long_t npg_dmas;
extern atomic_long_t npg_stale;
extern atomic_long_t npg_scratched;
extern atomic_long_t npg_iommu_errors;
extern atomic_long_t npg_device_faults;
extern atomic_long_t npg_table_pages;

struct npg_dev;

struct npg_buf {
	struct kref ref;
	void *mem; /* dense buffers (the ring): vmalloc_user memory; NULL for a sparse one */
	struct xarray pages; /* sparse buffers (tables): page index -> struct page */
	size_t bytes; /* a multiple of PAGE_SIZE */
	bool writable;
	unsigned long pgoff;
};

struct npg_ctx {
	struct kref ref;
	struct mm_struct *mm;
	struct mutex mutex;
	spinlock_t lookup_lock;
	struct list_head regions;
	u64 next_id;
	unsigned long next_pgoff;
	spinlock_t ring_lock;
	struct npg_buf *ring;
	u32 ring_entries;
	u64 ring_producer;
	u64 ring_dropped;
	struct work_struct teardown;
	atomic_t dead;
	/* DMA (ABI 3): see dma.c. */
	struct iommu_domain *domain;
	struct page *scratch;
	struct npg_dev *dev;
	u32 requester_id; /* the device's PCI requester ID, set before its fault handler */
};

struct npg_region {
	struct mmu_interval_notifier notifier;
	struct npg_ctx *ctx;
	struct list_head node;
	u64 id;
	unsigned long start;
	unsigned long npages;
	u32 access;
	spinlock_t lock;
	struct npg_buf *table;
	struct iommu_domain *domain; /* lock; NULL: not mapped for a device */
};

/* buf.c */
struct npg_buf *npg_buf_alloc(size_t bytes, bool writable);
struct page *npg_buf_page(struct npg_buf *b, unsigned long idx, bool alloc);
struct npg_buf *npg_buf_alloc_sparse(size_t bytes);
void npg_buf_put(struct npg_buf *b);
int npg_mmap(struct file *file, struct vm_area_struct *vma);

/* table.c */
u64 *npg_entry(const struct npg_region *r, unsigned long i);
unsigned long npg_next_table_page(unsigned long i);
int npg_table_prepare(struct npg_region *r, unsigned long first, unsigned long n);
unsigned long npg_region_end(const struct npg_region *r);
void npg_table_invalidate(struct npg_region *r, unsigned long first, unsigned long n);
u32 npg_table_set(struct npg_region *r, unsigned long i, u64 flags, unsigned long pfn,
		  struct iommu_iotlb_gather *g);
struct npg_region *npg_find(struct npg_ctx *ctx, u64 id);
void npg_region_destroy(struct npg_ctx *ctx, struct npg_region *r);
void npg_destroy_all(struct npg_ctx *ctx);
u32 npg_check_vmas(struct mm_struct *mm, unsigned long start, unsigned long end,
		   bool write);
u32 npg_range_status(u64 addr, u64 len);
bool npg_access_valid(u32 access);
long npg_register(struct npg_ctx *ctx, struct nprdma_register_args *a);

/* fault.c */
long npg_fault_in(struct npg_ctx *ctx, struct nprdma_fault_in_args *a);
long npg_resolve(struct npg_ctx *ctx, struct nprdma_resolve_args *a);

/* ring.c */
void npg_post(struct npg_ctx *ctx, u64 region, unsigned long start, unsigned long len,
	      u32 cause, u32 flags, u64 new_start);
u32 npg_cause(enum mmu_notifier_event event);
long npg_ring_setup(struct npg_ctx *ctx, struct nprdma_ring_setup_args *a);

/* dma.c */
int npg_iommu_point(struct npg_region *r, unsigned long iova, phys_addr_t pa, int prot,
		    struct iommu_iotlb_gather *g);
int npg_iommu_map_scratch(struct npg_ctx *ctx, unsigned long start, unsigned long npages);
void npg_iommu_scratch_range(struct npg_region *r, unsigned long first, unsigned long n);
void npg_ctx_quiesce(struct npg_ctx *ctx);
void npg_dma_detach(struct npg_ctx *ctx);
long npg_dma_attach(struct npg_ctx *ctx, struct nprdma_dma_attach_args *a);
long npg_dma(struct npg_ctx *ctx, struct nprdma_dma_args *a);
extern struct pci_driver npg_edu_driver;

/* devfault.c */
int npg_iommu_fault(struct iommu_domain *domain, struct device *dev, unsigned long iova,
		    int flags, void *token);

#endif /* NPRDMA_H */
