// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * nprdma.ko: the kernel half of linux-glue (docs/linux-glue.md, "The kernel module").
 *
 * A misc character device, /dev/nprdma-glue. Each open file is a context bound to the mm of
 * the process that opened it. A context registers regions of that mm WITHOUT pinning: a
 * region is an mmu_interval_notifier over its range (include/linux/mmu_notifier.h) plus a
 * page-state table that user space maps read-only. Faulting in and resolving frames is
 * hmm_range_fault() (mm/hmm.c) inside the mmu_interval_read_begin()/read_retry() loop, the
 * pattern Documentation/mm/hmm.rst describes and lib/test_hmm.c (dmirror_range_fault) uses.
 * Nothing here takes a page reference: no get_user_pages() or pin_user_pages(), and
 * hmm_range_fault() reads the page tables without taking references either.
 *
 * The ABI (ioctl numbers, argument layouts, table and ring layouts, status codes) is
 * nprdma_abi.h, which mirrors linux-glue/src/abi.rs.
 *
 * Objects, lifetimes and locks (only ring_lock is ever taken in interrupt context: by the
 * IOMMU fault handler, so it is always taken with interrupts off):
 *
 * struct npg_ctx (one per open file)
 *   - ref: kref. One reference for the open file, one for a queued teardown work item.
 *   - mm: the opener's mm, mmgrab()bed in open and mmdrop()ped when the context is freed.
 *     Only this mm may use the file: ioctl and mmap from any other mm get -EBADF (as
 *     amdkfd refuses a /dev/kfd descriptor used by another process,
 *     drivers/gpu/drm/amd/amdkfd/kfd_chardev.c kfd_ioctl).
 *   - mutex: serialises the ioctls, teardown and release. Held across hmm_range_fault()
 *     and mmu_interval_notifier_insert()/remove(), so it is ordered BEFORE mmap_lock; it
 *     is never taken by an invalidation callback or by mmap (which runs under mmap_lock).
 *   - lookup_lock (spinlock): the regions list, for the mmap lookup. Writers hold mutex
 *     too; mmap holds only lookup_lock (mmap_lock -> lookup_lock).
 *   - ring_lock (spinlock, irqsave): the ring's private producer and dropped counters (user
 *     space can write the shared header; the module never reads its own counters back from
 *     it) and the records. Taken by invalidation callbacks, after (never inside) a region's
 *     lock, and by the IOMMU fault handler (hard interrupt), which takes no other lock.
 *   - ring: set once under ring_lock by IOC_RING_SETUP, freed with the context.
 *   - dead: set by the first MMU_NOTIFY_RELEASE callback (the mm's exit_mmap): the
 *     teardown work then removes every region; release does the same at close.
 *
 * struct npg_region
 *   - notifier: the mmu_interval_notifier; inserted at register, removed at unregister,
 *     teardown or release, always under ctx->mutex and with no spinlock held (the removal
 *     may sleep until a running invalidation ends). Once removed, no callback runs.
 *   - lock (spinlock): the table's entries and generation and the notifier sequence
 *     (mmu_interval_set_seq). The invalidation callback takes only this lock and
 *     then ring_lock, so it never sleeps and is valid whether or not
 *     mmu_notifier_range_blockable() says it may block; it never has to return false.
 *   - table: npg_buf with the table; the region holds one reference, each VMA mapping it
 *     another, so an unregistered table stays valid while user space still maps it.
 *
 * struct npg_buf (memory shared with user space)
 *   - ref: kref: the owner (region or context) plus one per VMA (vm_ops open/close).
 *   - The ring is dense (vmalloc_user, remap_vmalloc_range at mmap). A page-state table is
 *     sparse: `pages` (an xarray, its own lock) holds a zeroed page for each 4 KiB of the
 *     table that has been needed, allocated (GFP_KERNEL) when the fault path is about to
 *     record a page in it (npg_table_prepare, ctx->mutex held, before r->lock) or when user
 *     space first reads it (npg_table_fault, under the mmap lock), and freed with the buffer.
 *     Readers under r->lock only xa_load(); an entry whose table page does not exist reads as
 *     absent with version 0, and invalidations skip it. Page 0 (the header) exists from
 *     registration. So a table costs 4 KiB per 2 MiB of region that was resolved or looked
 *     at, not 8 bytes per registered page.
 *
 * The IOMMU half (ABI 3, docs/linux-glue.md "The IOMMU half"): the module also binds one
 * DMA-capable PCI device, QEMU's edu (hw/misc/edu.c), with driver_managed_dma set, so the
 * driver core does not claim the device's default DMA domain for it (include/linux/pci.h).
 * IOC_DMA_ATTACH gives it to one open file: an unmanaged IOMMU domain (iommu_domain_alloc,
 * iommu_attach_device, drivers/iommu/iommu.c) in which IOVA = the process's virtual address.
 * Every 4 KiB page of every region of that file is mapped in it at all times, either to its
 * frame (the table entry is present) or to the file's scratch page (absent), so the device
 * never reaches an unmapped IOVA of a region (SMMUv3 under Linux terminates such an access;
 * nothing stalls PCIe). The fault path maps frames after a successful
 * mmu_interval_read_retry() under the region's lock; the invalidate callback points the
 * range's present pages back at the scratch page and syncs the IOTLB before it returns,
 * so the device can never reach a page the mm frees after the callback. IOC_DMA reports the
 * versions of the pages it touched before and after the transfer: a page absent at the start
 * or changed before the completion means the device may have used the scratch page and user
 * space re-sends (NP-RDMA's scheme). IOMMU page tables are 4 KiB leaves only: a region's
 * leaf tables are allocated when its scratch mapping is made (sleeping), and later
 * replacements (iommu_unmap_fast of one page, then iommu_map_atomic into the existing leaf
 * table) allocate nothing in the callbacks.
 *
 * struct npg_dev (the bound edu; at most one)
 *   - npg_dev_mutex (global mutex): npg_dev, dev->owner and ctx->dev. Held by attach,
 *     detach, IOC_DMA (across the wait for the completion: edu has one DMA engine), probe
 *     and remove. Order: ctx->mutex before npg_dev_mutex.
 *   - busy: a transfer was started and its completion interrupt not seen. Written by the
 *     starter (npg_dev_mutex held, device idle) and by the hard interrupt handler; read with
 *     READ_ONCE in wait_event conditions (wake_up/wait_event order the accesses). The
 *     handler takes no lock.
 *
 * DMA fields of struct npg_ctx: domain, scratch and dev are set by IOC_DMA_ATTACH under
 * ctx->mutex (dev also under npg_dev_mutex) and cleared at release; remove() clears dev
 * under npg_dev_mutex when the device goes away first. A region's `domain` (NULL: not
 * mapped for the device) is written under its lock, so the callbacks, which hold the
 * region's lock, see it set only once its scratch mapping exists.
 *
 * Module unload: the misc device's fops have .owner = THIS_MODULE, so every open file
 * holds a module reference and delete_module refuses while one is open (each mapping of
 * the device holds the file). Teardown work runs on our own workqueue, which module exit
 * destroys (draining it) after deregistering the device and the PCI driver.
 */

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

static struct workqueue_struct *npg_wq;
static atomic_t npg_contexts = ATOMIC_INIT(0);
static atomic_t npg_regions = ATOMIC_INIT(0);
static atomic_t npg_teardowns = ATOMIC_INIT(0);
/* hmm_range_fault() passes redone because an invalidation collided with them. */
static atomic_long_t npg_retries = ATOMIC_LONG_INIT(0);
/* Transfers completed, those reported stale, pages pointed back at a scratch page. */
static atomic_long_t npg_dmas = ATOMIC_LONG_INIT(0);
static atomic_long_t npg_stale = ATOMIC_LONG_INIT(0);
static atomic_long_t npg_scratched = ATOMIC_LONG_INIT(0);
/* iommu_map failures (the page is then left on the scratch page, or unmapped). */
static atomic_long_t npg_iommu_errors = ATOMIC_LONG_INIT(0);
/* IOMMU faults the SMMU driver reported for a file's domain (posted to its ring). */
static atomic_long_t npg_device_faults = ATOMIC_LONG_INIT(0);

/* QEMU's edu device, hw/misc/edu.c: registers of BAR 0. */
#define EDU_VENDOR 0x1234
#define EDU_DEVICE 0x11e8
#define EDU_REG_ID 0x00 /* 0xRRrr00ed */
#define EDU_REG_IRQ_STATUS 0x24
#define EDU_REG_IRQ_ACK 0x64
#define EDU_REG_DMA_SRC 0x80
#define EDU_REG_DMA_DST 0x88
#define EDU_REG_DMA_CNT 0x90
#define EDU_REG_DMA_CMD 0x98
#define EDU_DMA_RUN 0x1
#define EDU_DMA_TO_RAM 0x2 /* direction: edu's buffer to memory (EDU_DMA_TO_PCI) */
#define EDU_DMA_IRQ 0x4
#define EDU_IRQ_DMA 0x100
#define EDU_BUFFER 0x40000 /* edu's 4 KiB buffer in its DMA address space */
/* edu completes a transfer 100 ms of virtual time after it starts; 5 s is a dead device. */
#define NPG_DMA_TIMEOUT_MS 5000

struct npg_dev {
	struct pci_dev *pdev;
	void __iomem *mmio;
	struct npg_ctx *owner; /* npg_dev_mutex */
	bool busy;             /* see the head comment */
	wait_queue_head_t wq;
	atomic_long_t irqs;
};

static DEFINE_MUTEX(npg_dev_mutex);
static struct npg_dev *npg_dev; /* npg_dev_mutex */

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
	/* DMA (ABI 3): see the head comment. */
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

/* ---- shared buffers ---------------------------------------------------------------- */

static struct npg_buf *npg_buf_alloc(size_t bytes, bool writable)
{
	struct npg_buf *b = kzalloc(sizeof(*b), GFP_KERNEL);

	if (!b)
		return NULL;
	b->bytes = PAGE_ALIGN(bytes);
	b->mem = vmalloc_user(b->bytes); /* zeroed, VM_USERMAP for remap_vmalloc_range */
	if (!b->mem) {
		kfree(b);
		return NULL;
	}
	b->writable = writable;
	kref_init(&b->ref);
	return b;
}

/* Pages of page-state tables allocated now (the sysfs stats' table_pages). */
static atomic_long_t npg_table_pages = ATOMIC_LONG_INIT(0);

/*
 * Page `idx` of a sparse buffer, allocated zeroed if `alloc` (the caller may sleep); NULL if
 * it does not exist (or cannot be allocated).
 */
static struct page *npg_buf_page(struct npg_buf *b, unsigned long idx, bool alloc)
{
	struct page *p = xa_load(&b->pages, idx);
	struct page *old;

	if (p || !alloc || idx >= b->bytes >> PAGE_SHIFT)
		return p;
	p = alloc_page(GFP_KERNEL | __GFP_ZERO);
	if (!p)
		return NULL;
	old = xa_cmpxchg(&b->pages, idx, NULL, p, GFP_KERNEL);
	if (old) {
		/* Another thread stored it first, or the store failed. */
		__free_page(p);
		return xa_is_err(old) ? NULL : old;
	}
	atomic_long_inc(&npg_table_pages);
	return p;
}

/* A sparse buffer of `bytes` (a table), with its first page. */
static struct npg_buf *npg_buf_alloc_sparse(size_t bytes)
{
	struct npg_buf *b = kzalloc(sizeof(*b), GFP_KERNEL);

	if (!b)
		return NULL;
	b->bytes = PAGE_ALIGN(bytes);
	xa_init(&b->pages);
	kref_init(&b->ref);
	if (!npg_buf_page(b, 0, true)) {
		kfree(b);
		return NULL;
	}
	return b;
}

static void npg_buf_free(struct kref *ref)
{
	struct npg_buf *b = container_of(ref, struct npg_buf, ref);
	unsigned long idx;
	struct page *p;

	if (b->mem) {
		vfree(b->mem);
	} else {
		xa_for_each(&b->pages, idx, p) {
			__free_page(p);
			atomic_long_dec(&npg_table_pages);
		}
		xa_destroy(&b->pages);
	}
	kfree(b);
}

static void npg_buf_put(struct npg_buf *b)
{
	if (b)
		kref_put(&b->ref, npg_buf_free);
}

static struct nprdma_table_header *npg_table_hdr(const struct npg_region *r)
{
	return page_address(xa_load(&r->table->pages, 0)); /* exists from registration */
}

/* Byte offset of entry i in the table. */
static size_t npg_entry_off(unsigned long i)
{
	return sizeof(struct nprdma_table_header) + i * sizeof(u64);
}

/* Entry i, or NULL when its table page does not exist (the entry reads as 0). */
static u64 *npg_entry(const struct npg_region *r, unsigned long i)
{
	size_t off = npg_entry_off(i);
	struct page *p = xa_load(&r->table->pages, off >> PAGE_SHIFT);

	return p ? (u64 *)((char *)page_address(p) + (off & ~PAGE_MASK)) : NULL;
}

/* The first entry index after i that lies in the next table page. */
static unsigned long npg_next_table_page(unsigned long i)
{
	size_t next = ((npg_entry_off(i) >> PAGE_SHIFT) + 1) << PAGE_SHIFT;

	return (next - sizeof(struct nprdma_table_header)) / sizeof(u64);
}

/*
 * Allocates the table pages of entries [first, first + n) that do not exist yet, so the
 * fault path can record them under r->lock. Caller holds ctx->mutex (may sleep).
 */
static int npg_table_prepare(struct npg_region *r, unsigned long first, unsigned long n)
{
	unsigned long i;

	for (i = first; i < first + n; i = npg_next_table_page(i))
		if (!npg_buf_page(r->table, npg_entry_off(i) >> PAGE_SHIFT, true))
			return -ENOMEM;
	return 0;
}

static unsigned long npg_region_end(const struct npg_region *r)
{
	return r->start + (r->npages << NPG_PAGE_SHIFT);
}

/* ---- the invalidation ring ----------------------------------------------------------- */

/*
 * Publishes one record, or counts it in `dropped` when the ring is full: a record is never
 * overwritten. The consumer index lives in user-writable memory, so it is only read and
 * never trusted: any value that does not leave a free slot counts as full. Takes ring_lock.
 */
static void npg_post(struct npg_ctx *ctx, u64 region, unsigned long start, unsigned long len,
		     u32 cause, u32 flags, u64 new_start)
{
	struct nprdma_ring_header *h;
	struct nprdma_invalidation_record *rec;
	unsigned long irqflags;
	u64 consumer;

	spin_lock_irqsave(&ctx->ring_lock, irqflags);
	if (!ctx->ring)
		goto out;
	h = ctx->ring->mem;
	/* Pairs with user space's release store of `consumer`: its reads of the slot are done. */
	consumer = smp_load_acquire(&h->consumer);
	if (ctx->ring_producer - consumer >= ctx->ring_entries) {
		ctx->ring_dropped++;
		WRITE_ONCE(h->dropped, ctx->ring_dropped);
		goto out;
	}
	rec = (struct nprdma_invalidation_record *)(h + 1) +
	      (ctx->ring_producer & (ctx->ring_entries - 1));
	WRITE_ONCE(rec->seq, ctx->ring_producer);
	WRITE_ONCE(rec->region_id, region);
	WRITE_ONCE(rec->start, start);
	WRITE_ONCE(rec->len, len);
	WRITE_ONCE(rec->cause, cause);
	WRITE_ONCE(rec->flags, flags);
	WRITE_ONCE(rec->new_start, new_start);
	ctx->ring_producer++;
	/* Publishes the record: pairs with user space's acquire load of `producer`. */
	smp_store_release(&h->producer, ctx->ring_producer);
out:
	spin_unlock_irqrestore(&ctx->ring_lock, irqflags);
}

static u32 npg_cause(enum mmu_notifier_event event)
{
	switch (event) {
	case MMU_NOTIFY_UNMAP:
		return NPRDMA_CAUSE_UNMAPPED;
	case MMU_NOTIFY_PROTECTION_VMA:
	case MMU_NOTIFY_PROTECTION_PAGE:
	case MMU_NOTIFY_SOFT_DIRTY:
		return NPRDMA_CAUSE_PROTECTION;
	case MMU_NOTIFY_RELEASE:
		return NPRDMA_CAUSE_RELEASED;
	case MMU_NOTIFY_MIGRATE:
		return NPRDMA_CAUSE_FRAME_CHANGED;
	default: /* MMU_NOTIFY_CLEAR, MMU_NOTIFY_EXCLUSIVE and anything newer */
		return NPRDMA_CAUSE_CLEARED;
	}
}

/* ---- the page-state table ------------------------------------------------------------ */

/*
 * Marks pages [first, first + n) absent and bumps their versions, and the generation before
 * them (a reader comparing generations sees the change no later than the entries').
 * Caller holds r->lock.
 */
static void npg_table_invalidate(struct npg_region *r, unsigned long first, unsigned long n)
{
	struct nprdma_table_header *h = npg_table_hdr(r);
	unsigned long i = first, end = first + n;

	lockdep_assert_held(&r->lock);
	/* Pairs with user space's acquire loads of the generation (ModuleRegion::generation). */
	smp_store_release(&h->generation, h->generation + 1);
	while (i < end) {
		unsigned long stop = min(end, npg_next_table_page(i));
		u64 *e = npg_entry(r, i);

		/* A table page that does not exist holds only absent entries of version 0. */
		for (; e && i < stop; i++, e++) {
			u64 version = (READ_ONCE(*e) >> NPRDMA_ENTRY_VERSION_SHIFT) + 1;

			/* One 64-bit store per entry; pairs with user space's acquire loads. */
			smp_store_release(e, (version & 0xffffffffULL) << NPRDMA_ENTRY_VERSION_SHIFT);
		}
		i = stop;
	}
}

/* ---- the IOMMU domain --------------------------------------------------------------- */

/* iommu_map() and its atomic form: Linux 6.3 replaced iommu_map_atomic() by a gfp argument. */
static int npg_iommu_map(struct iommu_domain *domain, unsigned long iova, phys_addr_t pa,
			 int prot, bool atomic)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	return iommu_map(domain, iova, pa, PAGE_SIZE, prot, atomic ? GFP_ATOMIC : GFP_KERNEL);
#else
	if (atomic)
		return iommu_map_atomic(domain, iova, pa, PAGE_SIZE, prot);
	return iommu_map(domain, iova, pa, PAGE_SIZE, prot);
#endif
}

/* The device sees memory coherently (IOMMU_CACHE, as VFIO maps for coherent devices). */
#define NPG_PROT_RW (IOMMU_READ | IOMMU_WRITE | IOMMU_CACHE)

/*
 * Points the IOVA of one page of r at `pa` (a frame, or the scratch page). The IOVA is always
 * mapped (frame or scratch), so this is an unmap of one 4 KiB leaf, which never frees a
 * table (io-pgtable-arm frees tables only when a whole block-sized range goes), then a map
 * into the existing leaf table, which allocates nothing. The old translation leaves the IOTLB
 * at iommu_iotlb_sync(g), which the caller runs before it drops r->lock. A failed map falls
 * back to the scratch page; returns the map's error. Caller holds r->lock; r->domain is set.
 */
static int npg_iommu_point(struct npg_region *r, unsigned long iova, phys_addr_t pa, int prot,
			   struct iommu_iotlb_gather *g)
{
	phys_addr_t scratch = page_to_phys(r->ctx->scratch);
	int ret;

	lockdep_assert_held(&r->lock);
	iommu_unmap_fast(r->domain, iova, PAGE_SIZE, g);
	ret = npg_iommu_map(r->domain, iova, pa, prot, true);
	if (ret) {
		atomic_long_inc(&npg_iommu_errors);
		if (pa != scratch && npg_iommu_map(r->domain, iova, scratch, NPG_PROT_RW, true))
			atomic_long_inc(&npg_iommu_errors);
	}
	return ret;
}

/*
 * Maps every page of [start, start + npages) to the scratch page (sleeping allocations of
 * the leaf tables). On failure unmaps what it mapped. Caller holds ctx->mutex; the region is
 * not yet visible to the callbacks with its domain set.
 */
static int npg_iommu_map_scratch(struct npg_ctx *ctx, unsigned long start, unsigned long npages)
{
	phys_addr_t scratch = page_to_phys(ctx->scratch);
	unsigned long i;
	int ret;

	for (i = 0; i < npages; i++) {
		ret = npg_iommu_map(ctx->domain, start + (i << NPG_PAGE_SHIFT), scratch,
				    NPG_PROT_RW, false);
		if (ret) {
			if (i)
				iommu_unmap(ctx->domain, start, i << NPG_PAGE_SHIFT);
			return ret;
		}
		if (!(i % NPG_CHUNK_PAGES))
			cond_resched();
	}
	return 0;
}

/*
 * Sets page i's flags and, for a region mapped for the device, points its IOVA at frame
 * `pfn` (read-write if WRITABLE, else read-only); its version is bumped when the flags
 * change. If the IOMMU refuses the mapping the page stays absent. Caller holds r->lock.
 */
static u32 npg_table_set(struct npg_region *r, unsigned long i, u64 flags, unsigned long pfn,
			 struct iommu_iotlb_gather *g)
{
	u64 *e = npg_entry(r, i);
	u64 old, version;

	lockdep_assert_held(&r->lock);
	if (!e)
		return 0; /* npg_table_prepare() failed: the page stays absent */
	old = READ_ONCE(*e);
	version = old >> NPRDMA_ENTRY_VERSION_SHIFT;
	if ((old & 0xffffffffULL) != flags) {
		if (r->domain) {
			int prot = IOMMU_READ | IOMMU_CACHE;

			if (flags & NPRDMA_ENTRY_WRITABLE)
				prot |= IOMMU_WRITE;
			if (npg_iommu_point(r, r->start + (i << NPG_PAGE_SHIFT), PFN_PHYS(pfn), prot,
					    g))
				flags = 0;
		}
		version = (version + 1) & 0xffffffffULL;
		/* One 64-bit store; pairs with user space's acquire loads of the entry. */
		smp_store_release(e, (version << NPRDMA_ENTRY_VERSION_SHIFT) | flags);
	}
	return (u32)version;
}

/* ---- the interval notifier ----------------------------------------------------------- */

/*
 * Points the present pages of [first, first + n) of r back at the scratch page and syncs the
 * IOTLB, so the device cannot reach their frames once this returns. Caller holds r->lock.
 */
static void npg_iommu_scratch_range(struct npg_region *r, unsigned long first, unsigned long n)
{
	phys_addr_t scratch = page_to_phys(r->ctx->scratch);
	struct iommu_iotlb_gather g;
	unsigned long i = first, end = first + n, moved = 0;

	lockdep_assert_held(&r->lock);
	iommu_iotlb_gather_init(&g);
	while (i < end) {
		unsigned long stop = min(end, npg_next_table_page(i));
		u64 *e = npg_entry(r, i);

		for (; e && i < stop; i++, e++) {
			if (!(READ_ONCE(*e) & NPRDMA_ENTRY_PRESENT))
				continue; /* already on the scratch page */
			npg_iommu_point(r, r->start + (i << NPG_PAGE_SHIFT), scratch, NPG_PROT_RW,
					&g);
			moved++;
		}
		i = stop;
	}
	if (moved) {
		/* iommu_unmap_fast() left the old translations to this sync (include/linux/iommu.h). */
		iommu_iotlb_sync(r->domain, &g);
		atomic_long_add(moved, &npg_scratched);
	}
}

static bool npg_invalidate(struct mmu_interval_notifier *mni,
			   const struct mmu_notifier_range *range, unsigned long cur_seq)
{
	struct npg_region *r = container_of(mni, struct npg_region, notifier);
	struct npg_ctx *ctx = r->ctx;
	unsigned long start = max(range->start, r->start);
	unsigned long end = min(range->end, npg_region_end(r));
	bool release = range->event == MMU_NOTIFY_RELEASE;
	u32 flags = mmu_notifier_range_blockable(range) ? 0 : NPRDMA_RECORD_NONBLOCKING;

	/*
	 * Only spinlocks from here on, and IOMMU calls that neither sleep nor allocate but
	 * GFP_ATOMIC (npg_iommu_point): correct in blockable and non-blockable calls alike.
	 */
	spin_lock(&r->lock);
	mmu_interval_set_seq(mni, cur_seq);
	if (start < end) {
		unsigned long first = (start - r->start) >> NPG_PAGE_SHIFT;
		unsigned long n = (end - start) >> NPG_PAGE_SHIFT;

		/* The device first: it must not reach the frames once we return. */
		if (r->domain)
			npg_iommu_scratch_range(r, first, n);
		npg_table_invalidate(r, first, n);
	}
	spin_unlock(&r->lock);

	if (start < end)
		npg_post(ctx, r->id, start, end - start, npg_cause(range->event), flags, 0);

	/* The mm is being torn down (exit_mmap): remove every region of this context. */
	if (release && !atomic_xchg(&ctx->dead, 1)) {
		/* The work's reference; `dead` makes this the only time it is queued. */
		kref_get(&ctx->ref);
		queue_work(npg_wq, &ctx->teardown);
	}
	return true;
}

static const struct mmu_interval_notifier_ops npg_notifier_ops = {
	.invalidate = npg_invalidate,
};

/* ---- the DMA device (edu) ----------------------------------------------------------- */

/* Waits (uninterruptibly, bounded) until no transfer of dev runs; false if one still does. */
static bool npg_dev_wait_idle(struct npg_dev *dev)
{
	if (wait_event_timeout(dev->wq, !READ_ONCE(dev->busy),
			       msecs_to_jiffies(NPG_DMA_TIMEOUT_MS)))
		return true;
	dev_warn(&dev->pdev->dev, "nprdma: a transfer did not complete within %d ms\n",
		 NPG_DMA_TIMEOUT_MS);
	return false;
}

/*
 * Waits for a transfer of ctx's device that a killed IOC_DMA left running, before anything
 * it could touch is unmapped. Caller holds ctx->mutex.
 */
static void npg_ctx_quiesce(struct npg_ctx *ctx)
{
	mutex_lock(&npg_dev_mutex);
	if (ctx->dev)
		npg_dev_wait_idle(ctx->dev);
	mutex_unlock(&npg_dev_mutex);
}

/* ---- regions ------------------------------------------------------------------------- */

static struct npg_region *npg_find(struct npg_ctx *ctx, u64 id)
{
	struct npg_region *r;

	lockdep_assert_held(&ctx->mutex);
	list_for_each_entry(r, &ctx->regions, node)
		if (r->id == id)
			return r;
	return NULL;
}

/* Unlinks, removes the notifier (may sleep), clears the table and drops the region. */
static void npg_region_destroy(struct npg_ctx *ctx, struct npg_region *r)
{
	lockdep_assert_held(&ctx->mutex);
	spin_lock(&ctx->lookup_lock);
	list_del(&r->node);
	spin_unlock(&ctx->lookup_lock);
	mmu_interval_notifier_remove(&r->notifier);
	if (r->domain) {
		struct iommu_domain *domain = r->domain;

		npg_ctx_quiesce(ctx);
		spin_lock(&r->lock);
		r->domain = NULL;
		spin_unlock(&r->lock);
		/* No callback runs any more (removed above); this may free leaf tables. */
		iommu_unmap(domain, r->start, r->npages << NPG_PAGE_SHIFT);
	}
	/* A table user space still maps must not look valid any more. */
	spin_lock(&r->lock);
	npg_table_invalidate(r, 0, r->npages);
	spin_unlock(&r->lock);
	npg_buf_put(r->table);
	kfree(r);
	atomic_dec(&npg_regions);
}

static void npg_destroy_all(struct npg_ctx *ctx)
{
	struct npg_region *r, *tmp;

	lockdep_assert_held(&ctx->mutex);
	list_for_each_entry_safe(r, tmp, &ctx->regions, node)
		npg_region_destroy(ctx, r);
}

/*
 * Whether [start, end) is covered by VMAs without holes that allow the access. Caller holds
 * the mmap lock for read.
 */
static u32 npg_check_vmas(struct mm_struct *mm, unsigned long start, unsigned long end,
			  bool write)
{
	struct vm_area_struct *vma;
	unsigned long next = start;

	VMA_ITERATOR(vmi, mm, start);

	mmap_assert_locked(mm);
	for_each_vma_range(vmi, vma, end) {
		if (vma->vm_start > next)
			return NPRDMA_ST_UNMAPPED;
		if (vma->vm_flags & (VM_IO | VM_PFNMAP))
			return NPRDMA_ST_UNSUPPORTED;
		if (!(vma->vm_flags & VM_READ))
			return NPRDMA_ST_NOT_READABLE;
		if (write && !(vma->vm_flags & VM_WRITE))
			return NPRDMA_ST_NOT_WRITABLE;
		next = vma->vm_end;
		if (next >= end)
			return NPRDMA_ST_OK;
	}
	return NPRDMA_ST_UNMAPPED;
}

/* The status for a range of a region that hmm_range_fault() refused with -EFAULT/-EPERM. */
static u32 npg_diagnose(struct npg_ctx *ctx, unsigned long start, unsigned long end, bool write)
{
	u32 st;

	mmap_read_lock(ctx->mm);
	st = npg_check_vmas(ctx->mm, start, end, write);
	mmap_read_unlock(ctx->mm);
	switch (st) {
	case NPRDMA_ST_UNMAPPED:
		return NPRDMA_ST_REGION_GONE; /* registered, unmapped since */
	case NPRDMA_ST_OK:
		return NPRDMA_ST_UNSUPPORTED; /* the fault itself failed (SIGBUS, OOM, ...) */
	default:
		return st;
	}
}

static u32 npg_range_status(u64 addr, u64 len)
{
	if (len == 0)
		return NPRDMA_ST_EMPTY;
	if ((addr | len) & ((1ULL << NPG_PAGE_SHIFT) - 1))
		return NPRDMA_ST_MISALIGNED;
	if (addr + len < addr)
		return NPRDMA_ST_OVERFLOW;
	return NPRDMA_ST_OK;
}

static bool npg_access_valid(u32 access)
{
	return access == NPRDMA_ACCESS_READ || access == NPRDMA_ACCESS_WRITE;
}

static long npg_register(struct npg_ctx *ctx, struct nprdma_register_args *a)
{
	struct nprdma_table_header *h;
	struct npg_region *r, *other;
	unsigned long npages;
	u64 end;
	int ret;

	a->status = npg_range_status(a->addr, a->len);
	if (a->status)
		return 0;
	end = a->addr + a->len;
	if (!npg_access_valid(a->access) || a->flags || (a->len >> NPG_PAGE_SHIFT) > NPG_MAX_PAGES) {
		a->status = NPRDMA_ST_INVALID;
		return 0;
	}
	if (end > TASK_SIZE) {
		a->status = NPRDMA_ST_UNMAPPED;
		return 0;
	}
	list_for_each_entry(other, &ctx->regions, node) {
		if (a->addr < npg_region_end(other) && other->start < end) {
			a->region_id = other->id;
			a->status = NPRDMA_ST_ALREADY_REGISTERED;
			return 0;
		}
	}
	mmap_read_lock(ctx->mm);
	a->status = npg_check_vmas(ctx->mm, a->addr, end, a->access == NPRDMA_ACCESS_WRITE);
	mmap_read_unlock(ctx->mm);
	if (a->status)
		return 0;
	/*
	 * Between this check and the insert below the range may be unmapped: that is the same
	 * as an unmap right after registering, and the notifier reports it from the insert on.
	 */
	npages = a->len >> NPG_PAGE_SHIFT;
	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	r->table = npg_buf_alloc_sparse(sizeof(*h) + npages * sizeof(u64));
	if (!r->table) {
		kfree(r);
		return -ENOMEM;
	}
	r->ctx = ctx;
	r->id = ctx->next_id++;
	r->start = a->addr;
	r->npages = npages;
	r->access = a->access;
	spin_lock_init(&r->lock);
	h = npg_table_hdr(r);
	h->hdr.abi_version = NPRDMA_ABI_VERSION;
	h->hdr.struct_size = sizeof(*h);
	h->region_id = r->id;
	h->entries = npages;
	r->table->pgoff = ctx->next_pgoff;
	ctx->next_pgoff += r->table->bytes >> PAGE_SHIFT;

	/* With the device attached, every page of the region is mapped, to the scratch page. */
	if (ctx->domain) {
		ret = npg_iommu_map_scratch(ctx, r->start, npages);
		if (ret) {
			npg_buf_put(r->table);
			kfree(r);
			return ret;
		}
		r->domain = ctx->domain; /* not yet visible to any callback */
	}

	/* Touches no page: it only links the range into the mm's interval tree. */
	ret = mmu_interval_notifier_insert(&r->notifier, ctx->mm, r->start, a->len,
					   &npg_notifier_ops);
	if (ret) {
		if (r->domain)
			iommu_unmap(r->domain, r->start, a->len);
		npg_buf_put(r->table);
		kfree(r);
		return ret;
	}
	spin_lock(&ctx->lookup_lock);
	list_add_tail(&r->node, &ctx->regions);
	spin_unlock(&ctx->lookup_lock);
	atomic_inc(&npg_regions);
	a->region_id = r->id;
	a->table_offset = (u64)r->table->pgoff << PAGE_SHIFT;
	a->table_entries = npages;
	return 0;
}

/* ---- fault-in and resolution --------------------------------------------------------- */

struct npg_fault_out {
	u64 pages;
	u32 huge_blocks;
	unsigned long last_block; /* last 2 MiB block counted, + 1 (0: none) */
	u32 first_version;        /* the first page's version afterwards */
};

/* Whether the naturally aligned 2 MiB block around addr lies inside the region. */
static bool npg_block_inside(const struct npg_region *r, unsigned long addr)
{
	unsigned long block = addr & ~(NPG_HUGE_SIZE - 1);

	return block >= r->start && block + NPG_HUGE_SIZE <= npg_region_end(r);
}

/*
 * Records hmm_range_fault()'s answer for [start, start + n pages) in the table. With `whole`
 * a page mapped by a 2 MiB block marks the whole block (every page of a high-order mapping
 * has the same flags, include/linux/hmm.h hmm_pfn_to_map_order). Caller holds r->lock, after
 * a successful mmu_interval_read_retry() check.
 */
static void npg_record(struct npg_region *r, unsigned long start, unsigned long n,
		       const unsigned long *pfns, bool whole, struct npg_fault_out *out)
{
	struct iommu_iotlb_gather g;
	unsigned long i;

	iommu_iotlb_gather_init(&g);
	for (i = 0; i < n; i++) {
		unsigned long addr = start + (i << NPG_PAGE_SHIFT);
		unsigned long p = pfns[i];
		unsigned long pfn = p & ~HMM_PFN_FLAGS;
		bool huge;
		u64 flags;
		u32 version;

		if (!(p & HMM_PFN_VALID))
			continue;
		huge = hmm_pfn_to_map_order(p) >= NPG_HUGE_ORDER && npg_block_inside(r, addr);
		flags = NPRDMA_ENTRY_PRESENT;
		if ((p & HMM_PFN_WRITE) && r->access == NPRDMA_ACCESS_WRITE)
			flags |= NPRDMA_ENTRY_WRITABLE;
		if (huge)
			flags |= NPRDMA_ENTRY_HUGE;
		if (huge && whole) {
			unsigned long block = addr & ~(NPG_HUGE_SIZE - 1);
			unsigned long b = (block - r->start) >> NPG_PAGE_SHIFT;
			unsigned long base = pfn - ((addr - block) >> NPG_PAGE_SHIFT);
			unsigned long j;

			/* The IOMMU maps the block as 512 pages too (4 KiB leaves only). */
			for (j = 0; j < NPG_HUGE_SIZE >> NPG_PAGE_SHIFT; j++)
				npg_table_set(r, b + j, flags, base + j, &g);
		}
		version = npg_table_set(r, (addr - r->start) >> NPG_PAGE_SHIFT, flags, pfn, &g);
		if (i == 0)
			out->first_version = version;
		out->pages++;
		if (huge && out->last_block != (addr >> NPG_HUGE_SHIFT) + 1) {
			out->last_block = (addr >> NPG_HUGE_SHIFT) + 1;
			out->huge_blocks++;
		}
	}
	/* Scratch translations replaced above leave the IOTLB before the device is started. */
	if (r->domain)
		iommu_iotlb_sync(r->domain, &g);
}

/*
 * hmm_range_fault() over [start, start + n pages) of r (n <= NPG_CHUNK_PAGES) in the
 * mmu_interval_read_begin()/read_retry() loop, then the table update under r->lock.
 * Returns 0, or -EBUSY after HMM_RANGE_DEFAULT_TIMEOUT of collisions, -EINTR on a fatal
 * signal, or hmm_range_fault()'s error. Caller holds ctx->mutex and no mmap lock.
 */
static int npg_fault_chunk(struct npg_region *r, unsigned long start, unsigned long n,
			   bool fault, bool write, bool whole, unsigned long *pfns,
			   struct npg_fault_out *out)
{
	struct mm_struct *mm = r->ctx->mm;
	unsigned long timeout = jiffies + msecs_to_jiffies(HMM_RANGE_DEFAULT_TIMEOUT);
	struct hmm_range range = {
		.notifier = &r->notifier,
		.start = start,
		.end = start + (n << NPG_PAGE_SHIFT),
		.hmm_pfns = pfns,
		.default_flags = fault ? HMM_PFN_REQ_FAULT | (write ? HMM_PFN_REQ_WRITE : 0) : 0,
		.pfn_flags_mask = 0,
	};
	unsigned long first = (start - r->start) >> NPG_PAGE_SHIFT;
	int ret;

	/* The table pages the record below may write: all of a 2 MiB block with `whole`. */
	ret = npg_table_prepare(r, first, n);
	if (!ret && whole && npg_block_inside(r, start)) {
		unsigned long block = start & ~(NPG_HUGE_SIZE - 1);

		ret = npg_table_prepare(r, (block - r->start) >> NPG_PAGE_SHIFT,
					NPG_HUGE_SIZE >> NPG_PAGE_SHIFT);
	}
	if (ret)
		return ret;
	for (;;) {
		if (fatal_signal_pending(current))
			return -EINTR;
		if (time_after(jiffies, timeout))
			return -EBUSY;
		range.notifier_seq = mmu_interval_read_begin(&r->notifier);
		mmap_read_lock(mm);
		ret = hmm_range_fault(&range);
		mmap_read_unlock(mm);
		if (ret == -EBUSY) {
			atomic_long_inc(&npg_retries);
			continue;
		}
		if (ret)
			return ret;
		spin_lock(&r->lock);
		if (mmu_interval_read_retry(&r->notifier, range.notifier_seq)) {
			spin_unlock(&r->lock);
			atomic_long_inc(&npg_retries);
			continue;
		}
		npg_record(r, start, n, pfns, whole, out);
		spin_unlock(&r->lock);
		return 0;
	}
}

/* The status for an error of npg_fault_chunk(), or a negative errno to return. */
static long npg_fault_status(struct npg_ctx *ctx, int err, unsigned long start,
			     unsigned long end, bool write, u32 *status)
{
	switch (err) {
	case -EFAULT:
	case -EPERM:
		*status = npg_diagnose(ctx, start, end, write);
		return 0;
	case -EBUSY:
		*status = NPRDMA_ST_CONTENDED;
		return 0;
	case -EHWPOISON:
		*status = NPRDMA_ST_HWPOISON;
		return 0;
	default:
		return err;
	}
}

/* Common checks of IOC_FAULT_IN and IOC_RESOLVE: 0 and the region, or a status. */
static u32 npg_check_fault(struct npg_ctx *ctx, u64 id, u64 addr, u64 len, u32 access,
			   u32 flags, struct npg_region **out)
{
	struct npg_region *r = npg_find(ctx, id);
	u32 st;

	if (!r)
		return NPRDMA_ST_UNKNOWN_REGION;
	st = npg_range_status(addr, len);
	if (st)
		return st;
	if (!npg_access_valid(access) || (flags & ~NPRDMA_FAULT_IN_QUERY_ONLY))
		return NPRDMA_ST_INVALID;
	if (addr < r->start || addr + len > npg_region_end(r))
		return NPRDMA_ST_NOT_REGISTERED;
	if (access == NPRDMA_ACCESS_WRITE && r->access != NPRDMA_ACCESS_WRITE)
		return NPRDMA_ST_NOT_WRITABLE;
	*out = r;
	return NPRDMA_ST_OK;
}

static long npg_fault_in(struct npg_ctx *ctx, struct nprdma_fault_in_args *a)
{
	unsigned long min0 = current->min_flt, maj0 = current->maj_flt;
	bool write = a->access == NPRDMA_ACCESS_WRITE;
	bool fault = !(a->flags & NPRDMA_FAULT_IN_QUERY_ONLY);
	struct npg_fault_out out = {};
	struct npg_region *r = NULL;
	unsigned long addr, end, *pfns;
	long ret = 0;

	a->status = npg_check_fault(ctx, a->region_id, a->addr, a->len, a->access, a->flags, &r);
	if (a->status)
		return 0;
	pfns = kmalloc_array(NPG_CHUNK_PAGES, sizeof(*pfns), GFP_KERNEL);
	if (!pfns)
		return -ENOMEM;
	end = a->addr + a->len;
	for (addr = a->addr; addr < end; addr += NPG_CHUNK_PAGES << NPG_PAGE_SHIFT) {
		unsigned long n = min(NPG_CHUNK_PAGES, (end - addr) >> NPG_PAGE_SHIFT);
		int err = npg_fault_chunk(r, addr, n, fault, write, false, pfns, &out);

		if (err) {
			ret = npg_fault_status(ctx, err, addr, addr + (n << NPG_PAGE_SHIFT), write,
					       &a->status);
			break;
		}
		cond_resched();
	}
	kfree(pfns);
	/*
	 * Faults hmm_range_fault() took for us count for this task (mm/memory.c
	 * mm_account_fault: with regs == NULL only the per-task counters move).
	 */
	a->minor_faults = current->min_flt - min0;
	a->major_faults = current->maj_flt - maj0;
	a->pages_mapped = out.pages;
	a->huge_blocks = out.huge_blocks;
	return ret;
}

static long npg_resolve(struct npg_ctx *ctx, struct nprdma_resolve_args *a)
{
	unsigned long min0 = current->min_flt, maj0 = current->maj_flt;
	bool write = a->access == NPRDMA_ACCESS_WRITE;
	bool fault = !(a->flags & NPRDMA_FAULT_IN_QUERY_ONLY);
	struct npg_fault_out out = {};
	struct npg_region *r = NULL;
	unsigned long pfn, p = 0;
	int err;

	a->status = npg_check_fault(ctx, a->region_id, a->addr, 1UL << NPG_PAGE_SHIFT, a->access,
				    a->flags, &r);
	if (a->status)
		return 0;
	err = npg_fault_chunk(r, a->addr, 1, fault, write, true, &p, &out);
	if (err)
		return npg_fault_status(ctx, err, a->addr, a->addr + (1UL << NPG_PAGE_SHIFT), write,
					&a->status);
	if (!(p & HMM_PFN_VALID)) {
		a->kind = NPRDMA_KIND_ABSENT;
		return 0;
	}
	pfn = p & ~HMM_PFN_FLAGS;
	if (hmm_pfn_to_map_order(p) >= NPG_HUGE_ORDER && npg_block_inside(r, a->addr)) {
		unsigned long block = a->addr & ~(NPG_HUGE_SIZE - 1);

		a->order = NPG_HUGE_ORDER;
		a->mapping_start = block;
		a->pfn = pfn - ((a->addr - block) >> NPG_PAGE_SHIFT);
	} else {
		a->order = 0;
		a->mapping_start = a->addr;
		a->pfn = pfn;
	}
	a->version = out.first_version;
	if (current->maj_flt != maj0)
		a->kind = NPRDMA_KIND_MAJOR;
	else if (current->min_flt != min0)
		a->kind = NPRDMA_KIND_MINOR;
	else
		a->kind = NPRDMA_KIND_PRESENT;
	return 0;
}

static long npg_ring_setup(struct npg_ctx *ctx, struct nprdma_ring_setup_args *a)
{
	struct nprdma_ring_header *h;
	struct npg_buf *b;
	size_t bytes;

	if (!a->entries || a->entries > NPG_MAX_RING || (a->entries & (a->entries - 1)) ||
	    a->flags || ctx->ring) {
		a->status = NPRDMA_ST_INVALID;
		return 0;
	}
	bytes = sizeof(*h) + (size_t)a->entries * sizeof(struct nprdma_invalidation_record);
	b = npg_buf_alloc(bytes, true);
	if (!b)
		return -ENOMEM;
	h = b->mem;
	h->hdr.abi_version = NPRDMA_ABI_VERSION;
	h->hdr.struct_size = sizeof(*h);
	h->entries = a->entries;
	h->entry_size = sizeof(struct nprdma_invalidation_record);
	b->pgoff = ctx->next_pgoff;
	ctx->next_pgoff += b->bytes >> PAGE_SHIFT;
	spin_lock_irq(&ctx->ring_lock);
	ctx->ring_entries = a->entries;
	ctx->ring = b;
	spin_unlock_irq(&ctx->ring_lock);
	a->ring_offset = (u64)b->pgoff << PAGE_SHIFT;
	a->ring_bytes = bytes;
	return 0;
}

/* ---- device DMA (ABI 3) -------------------------------------------------------------- */

/*
 * Gives the device back to its default domain (after any transfer ends) and frees the
 * file's domain and scratch page. Idempotent. Caller holds ctx->mutex.
 */
static void npg_dma_detach(struct npg_ctx *ctx)
{
	struct npg_region *r;

	lockdep_assert_held(&ctx->mutex);
	if (!ctx->domain)
		return;
	mutex_lock(&npg_dev_mutex);
	if (ctx->dev) {
		struct npg_dev *dev = ctx->dev;

		/* After a killed IOC_DMA: the transfer ends before its mappings go. */
		npg_dev_wait_idle(dev);
		iommu_detach_device(ctx->domain, &dev->pdev->dev);
		dev->owner = NULL;
		ctx->dev = NULL;
		dev_info(&dev->pdev->dev, "nprdma: IOMMU domain detached, device back in its default domain\n");
	}
	mutex_unlock(&npg_dev_mutex);
	/* The callbacks stop touching the domain before it goes. */
	list_for_each_entry(r, &ctx->regions, node) {
		spin_lock(&r->lock);
		r->domain = NULL;
		spin_unlock(&r->lock);
	}
	iommu_domain_free(ctx->domain); /* frees its page tables */
	ctx->domain = NULL;
	__free_page(ctx->scratch);
	ctx->scratch = NULL;
}

/*
 * IOMMU fault forwarding (ABI 4). Where the SMMU driver reports a context fault with
 * report_iommu_fault() (drivers/iommu/iommu.c), as arm-smmu does for SMMUv1/v2 such as the
 * MMU-500 from its context-bank interrupt (drivers/iommu/arm/arm-smmu/arm-smmu.c
 * arm_smmu_context_fault(): the faulting address from CB_FAR, read or write from FSYNR0.WNR),
 * the fault is posted to the file's ring as a NPRDMA_CAUSE_DEVICE_FAULT record: start = the
 * IOVA (the process's virtual address), len 0, region_id 0 (the handler runs in hard
 * interrupt context and looks up no region; user space finds it by address), flags
 * NPRDMA_RECORD_DEVICE_WRITE for a write, new_start = the device's PCI requester ID (its
 * stream). User space's policy then decides what the bare-metal driver decides. arm-smmu
 * programs its context banks to terminate faulting transactions (SMMU_CBn_SCTLR.CFCFG = 0,
 * Arm IHI 0062), so under Linux the access was already aborted when the record is read and
 * the only policy left is fault-in and re-send. With the scratch page every IOVA of a region
 * is mapped, so a record means an access outside every region. arm-smmu-v3 never calls
 * report_iommu_fault() (its events go to iommu_report_device_fault(), a per-device path), so
 * on QEMU's SMMUv3 the handler is installed but never runs, and QEMU models no SMMUv2: this
 * path is compiled for arm64 and x86_64, not exercised. Returns 0 (handled), so the SMMU
 * driver does not log the fault again.
 */
static int npg_iommu_fault(struct iommu_domain *domain, struct device *dev, unsigned long iova,
			   int flags, void *token)
{
	struct npg_ctx *ctx = token;
	u32 rflags = (flags & IOMMU_FAULT_WRITE) ? NPRDMA_RECORD_DEVICE_WRITE : 0;

	atomic_long_inc(&npg_device_faults);
	npg_post(ctx, 0, iova, 0, NPRDMA_CAUSE_DEVICE_FAULT, rflags, READ_ONCE(ctx->requester_id));
	return 0;
}

static long npg_dma_attach(struct npg_ctx *ctx, struct nprdma_dma_attach_args *a)
{
	struct iommu_domain *domain;
	struct npg_region *r;
	struct npg_dev *dev;
	struct page *scratch;
	long ret;

	if (a->flags) {
		a->status = NPRDMA_ST_INVALID;
		return 0;
	}
	if (ctx->domain)
		return -EALREADY;
	scratch = alloc_page(GFP_KERNEL | __GFP_ZERO);
	if (!scratch)
		return -ENOMEM;
	mutex_lock(&npg_dev_mutex);
	dev = npg_dev;
	ret = -ENODEV;
	if (!dev || !device_iommu_mapped(&dev->pdev->dev))
		goto unlock;
	ret = -EBUSY;
	if (dev->owner)
		goto unlock;
	ret = -ENOMEM;
	domain = iommu_domain_alloc(dev->pdev->dev.bus);
	if (!domain)
		goto unlock;
	WRITE_ONCE(ctx->requester_id, pci_dev_id(dev->pdev));
	/* Before the attach: the device cannot fault in this domain until it is in it. */
	iommu_set_fault_handler(domain, npg_iommu_fault, ctx);
	ret = iommu_attach_device(domain, &dev->pdev->dev);
	if (ret) {
		iommu_domain_free(domain);
		goto unlock;
	}
	dev->owner = ctx;
	ctx->dev = dev;
	ctx->domain = domain;
	ctx->scratch = scratch;
	mutex_unlock(&npg_dev_mutex);

	/* Every region's pages go on the scratch page; their entries start absent. */
	list_for_each_entry(r, &ctx->regions, node) {
		ret = npg_iommu_map_scratch(ctx, r->start, r->npages);
		if (ret) {
			npg_dma_detach(ctx);
			return ret;
		}
		spin_lock(&r->lock);
		npg_table_invalidate(r, 0, r->npages);
		r->domain = domain;
		spin_unlock(&r->lock);
	}
	a->pgsize_bitmap = domain->pgsize_bitmap;
	a->aperture_end = domain->geometry.aperture_end;
	a->pci_address = (pci_domain_nr(dev->pdev->bus) << 16) | (dev->pdev->bus->number << 8) |
			 dev->pdev->devfn;
	dev_info(&dev->pdev->dev,
		 "nprdma: unmanaged IOMMU domain (IOVA = VA of pid %d) attached, page sizes %#lx, aperture end %#llx\n",
		 task_pid_nr(current), domain->pgsize_bitmap,
		 (unsigned long long)domain->geometry.aperture_end);
	return 0;
unlock:
	mutex_unlock(&npg_dev_mutex);
	__free_page(scratch);
	return ret;
}

/* Page i's entry (present bit, version) for IOC_DMA. */
static void npg_dma_peek(struct npg_region *r, unsigned long first, u32 pages, u32 *present,
			 u32 *versions, bool *read_only)
{
	u32 i;

	*present = 0;
	*read_only = false;
	spin_lock(&r->lock);
	for (i = 0; i < pages; i++) {
		u64 *e = npg_entry(r, first + i);
		u64 v = e ? READ_ONCE(*e) : 0;

		if (v & NPRDMA_ENTRY_PRESENT) {
			*present |= 1U << i;
			if (!(v & NPRDMA_ENTRY_WRITABLE))
				*read_only = true;
		}
		versions[i] = v >> NPRDMA_ENTRY_VERSION_SHIFT;
	}
	spin_unlock(&r->lock);
}

static long npg_dma(struct npg_ctx *ctx, struct nprdma_dma_args *a)
{
	bool to_ram = a->direction == NPRDMA_DMA_FROM_DEVICE;
	struct npg_region *r = npg_find(ctx, a->region_id);
	unsigned long first;
	bool read_only;
	struct npg_dev *dev;
	u32 present_after, i;
	u64 iova, buf, t0;
	long ret, left;

	if (!r) {
		a->status = NPRDMA_ST_UNKNOWN_REGION;
		return 0;
	}
	if (!a->len || a->len > NPRDMA_DMA_BUFFER_BYTES || a->flags ||
	    a->dev_offset > NPRDMA_DMA_BUFFER_BYTES - a->len ||
	    (a->direction != NPRDMA_DMA_TO_DEVICE && !to_ram)) {
		a->status = NPRDMA_ST_INVALID;
		return 0;
	}
	if (a->addr < r->start || a->addr > npg_region_end(r) - a->len) {
		a->status = NPRDMA_ST_NOT_REGISTERED;
		return 0;
	}
	if (to_ram && r->access != NPRDMA_ACCESS_WRITE) {
		a->status = NPRDMA_ST_NOT_WRITABLE;
		return 0;
	}
	if (mutex_lock_killable(&npg_dev_mutex))
		return -EINTR;
	dev = ctx->dev;
	ret = -ENOTCONN;
	if (!ctx->domain)
		goto unlock;
	ret = -ENODEV;
	if (!dev)
		goto unlock;
	/* A transfer a killed caller left running ends first. */
	ret = -EINTR;
	if (wait_event_killable(dev->wq, !READ_ONCE(dev->busy)))
		goto unlock;

	first = (a->addr - r->start) >> NPG_PAGE_SHIFT;
	a->pages = ((a->addr + a->len - 1) >> NPG_PAGE_SHIFT) - (a->addr >> NPG_PAGE_SHIFT) + 1;
	npg_dma_peek(r, first, a->pages, &a->present_before, a->version_before, &read_only);
	/*
	 * A page the CPU maps read-only is mapped read-only for the device: a device write there
	 * would fault in the IOMMU. Nothing can make it read-only while the transfer runs (only
	 * this file's fault path maps frames, and ctx->mutex is held), so checking now suffices.
	 */
	if (to_ram && read_only) {
		a->status = NPRDMA_ST_NOT_WRITABLE;
		ret = 0;
		goto unlock;
	}

	iova = a->addr;
	buf = EDU_BUFFER + a->dev_offset;
	WRITE_ONCE(dev->busy, true);
	writeq(to_ram ? buf : iova, dev->mmio + EDU_REG_DMA_SRC);
	writeq(to_ram ? iova : buf, dev->mmio + EDU_REG_DMA_DST);
	writeq(a->len, dev->mmio + EDU_REG_DMA_CNT);
	t0 = ktime_get_ns();
	/* writeq orders the descriptor before the command (a posted MMIO write each). */
	writeq(EDU_DMA_RUN | EDU_DMA_IRQ | (to_ram ? EDU_DMA_TO_RAM : 0),
	       dev->mmio + EDU_REG_DMA_CMD);
	left = wait_event_killable_timeout(dev->wq, !READ_ONCE(dev->busy),
					   msecs_to_jiffies(NPG_DMA_TIMEOUT_MS));
	if (left < 0) {
		/* Still running: detach, region removal and the next transfer wait for it. */
		ret = -EINTR;
		goto unlock;
	}
	if (left == 0) {
		ret = -ETIMEDOUT;
		goto unlock;
	}
	a->elapsed_ns = ktime_get_ns() - t0;
	npg_dma_peek(r, first, a->pages, &present_after, a->version_after, &read_only);
	a->stale = 0;
	for (i = 0; i < a->pages; i++) {
		if (!(a->present_before & (1U << i)) || a->version_before[i] != a->version_after[i])
			a->stale = 1;
	}
	atomic_long_inc(&npg_dmas);
	if (a->stale)
		atomic_long_inc(&npg_stale);
	ret = 0;
unlock:
	mutex_unlock(&npg_dev_mutex);
	return ret;
}

/* The completion interrupt (INTx, maybe shared). Hard-IRQ context: no lock. */
static irqreturn_t npg_edu_irq(int irq, void *data)
{
	struct npg_dev *dev = data;
	u32 status = readl(dev->mmio + EDU_REG_IRQ_STATUS);

	if (!status || status == ~0U)
		return IRQ_NONE;
	writel(status, dev->mmio + EDU_REG_IRQ_ACK);
	atomic_long_inc(&dev->irqs);
	if (status & EDU_IRQ_DMA) {
		WRITE_ONCE(dev->busy, false);
		wake_up(&dev->wq);
	}
	return IRQ_HANDLED;
}

static int npg_edu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct npg_dev *dev;
	u32 ident;
	int ret;

	dev = devm_kzalloc(&pdev->dev, sizeof(*dev), GFP_KERNEL);
	if (!dev)
		return -ENOMEM;
	ret = pcim_enable_device(pdev);
	if (ret)
		return ret;
	ret = pcim_iomap_regions(pdev, BIT(0), "nprdma");
	if (ret)
		return ret;
	dev->pdev = pdev;
	dev->mmio = pcim_iomap_table(pdev)[0];
	init_waitqueue_head(&dev->wq);
	ident = readl(dev->mmio + EDU_REG_ID);
	if ((ident & 0xff) != 0xed) {
		dev_err(&pdev->dev, "nprdma: not an edu (identification %#x)\n", ident);
		return -ENODEV;
	}
	pci_set_master(pdev);
	ret = devm_request_irq(&pdev->dev, pdev->irq, npg_edu_irq, IRQF_SHARED, "nprdma-edu", dev);
	if (ret)
		return ret;
	mutex_lock(&npg_dev_mutex);
	if (npg_dev) {
		mutex_unlock(&npg_dev_mutex);
		dev_info(&pdev->dev, "nprdma: one edu is bound already; not this one\n");
		return -EBUSY;
	}
	npg_dev = dev;
	mutex_unlock(&npg_dev_mutex);
	pci_set_drvdata(pdev, dev);
	dev_info(&pdev->dev, "nprdma: edu %u.%u bound, INTx irq %d, %s\n", ident >> 24,
		 (ident >> 16) & 0xff, pdev->irq,
		 device_iommu_mapped(&pdev->dev) ? "behind an IOMMU" : "no IOMMU (DMA refused)");
	return 0;
}

static void npg_edu_remove(struct pci_dev *pdev)
{
	struct npg_dev *dev = pci_get_drvdata(pdev);

	mutex_lock(&npg_dev_mutex);
	npg_dev_wait_idle(dev);
	if (dev->owner) {
		/* The owner keeps its domain (freed at its release) but loses the device. */
		iommu_detach_device(dev->owner->domain, &pdev->dev);
		dev->owner->dev = NULL;
		dev->owner = NULL;
	}
	npg_dev = NULL;
	mutex_unlock(&npg_dev_mutex);
	pci_clear_master(pdev);
	/* devres frees the interrupt (synchronising with the handler), the mapping and dev. */
}

static const struct pci_device_id npg_edu_ids[] = {
	{ PCI_DEVICE(EDU_VENDOR, EDU_DEVICE) },
	{ 0 }
};
MODULE_DEVICE_TABLE(pci, npg_edu_ids);

static struct pci_driver npg_edu_driver = {
	.name = "nprdma-edu",
	.id_table = npg_edu_ids,
	.probe = npg_edu_probe,
	.remove = npg_edu_remove,
	/* DMA goes through our own unmanaged domain, never the DMA API's default one. */
	.driver_managed_dma = true,
};

/* ---- the file ------------------------------------------------------------------------ */

static void npg_ctx_free(struct kref *ref)
{
	struct npg_ctx *ctx = container_of(ref, struct npg_ctx, ref);

	WARN_ON(!list_empty(&ctx->regions));
	WARN_ON(ctx->domain);
	npg_buf_put(ctx->ring);
	mmdrop(ctx->mm);
	kfree(ctx);
	atomic_dec(&npg_contexts);
}

static void npg_teardown_fn(struct work_struct *work)
{
	struct npg_ctx *ctx = container_of(work, struct npg_ctx, teardown);

	mutex_lock(&ctx->mutex);
	npg_dma_detach(ctx); /* the device is free for another process */
	npg_destroy_all(ctx);
	mutex_unlock(&ctx->mutex);
	atomic_inc(&npg_teardowns);
	kref_put(&ctx->ref, npg_ctx_free);
}

static int npg_open(struct inode *inode, struct file *file)
{
	struct npg_ctx *ctx;

	if (!current->mm)
		return -EINVAL;
	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL);
	if (!ctx)
		return -ENOMEM;
	kref_init(&ctx->ref);
	mutex_init(&ctx->mutex);
	spin_lock_init(&ctx->lookup_lock);
	spin_lock_init(&ctx->ring_lock);
	INIT_LIST_HEAD(&ctx->regions);
	INIT_WORK(&ctx->teardown, npg_teardown_fn);
	ctx->next_id = 1;
	ctx->next_pgoff = 1; /* offset 0 is never an object */
	ctx->mm = current->mm;
	mmgrab(ctx->mm);
	file->private_data = ctx;
	atomic_inc(&npg_contexts);
	return 0;
}

static int npg_release(struct inode *inode, struct file *file)
{
	struct npg_ctx *ctx = file->private_data;

	mutex_lock(&ctx->mutex);
	npg_dma_detach(ctx);
	npg_destroy_all(ctx);
	mutex_unlock(&ctx->mutex);
	kref_put(&ctx->ref, npg_ctx_free);
	return 0;
}

union npg_args {
	struct nprdma_abi_header hdr;
	struct nprdma_version_args version;
	struct nprdma_register_args reg;
	struct nprdma_unregister_args unreg;
	struct nprdma_fault_in_args fault;
	struct nprdma_ring_setup_args ring;
	struct nprdma_resolve_args resolve;
	struct nprdma_dma_attach_args attach;
	struct nprdma_dma_args dma;
};

static long npg_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct npg_ctx *ctx = file->private_data;
	void __user *uarg = (void __user *)arg;
	union npg_args a;
	size_t size;
	long ret;

	if (_IOC_TYPE(cmd) != NPRDMA_IOCTL_MAGIC)
		return -ENOTTY;
	switch (_IOC_NR(cmd)) {
	case _IOC_NR(NPRDMA_IOC_VERSION):
		size = sizeof(a.version);
		break;
	case _IOC_NR(NPRDMA_IOC_REGISTER):
		size = sizeof(a.reg);
		break;
	case _IOC_NR(NPRDMA_IOC_UNREGISTER):
		size = sizeof(a.unreg);
		break;
	case _IOC_NR(NPRDMA_IOC_FAULT_IN):
		size = sizeof(a.fault);
		break;
	case _IOC_NR(NPRDMA_IOC_RING_SETUP):
		size = sizeof(a.ring);
		break;
	case _IOC_NR(NPRDMA_IOC_RESOLVE):
		size = sizeof(a.resolve);
		break;
	case _IOC_NR(NPRDMA_IOC_DMA_ATTACH):
		size = sizeof(a.attach);
		break;
	case _IOC_NR(NPRDMA_IOC_DMA):
		size = sizeof(a.dma);
		break;
	default:
		return -ENOTTY;
	}
	if (current->mm != ctx->mm)
		return -EBADF;
	/* The size first (a struct of another size cannot be read), then the version. */
	if (_IOC_DIR(cmd) != (_IOC_READ | _IOC_WRITE) || _IOC_SIZE(cmd) != size)
		return -EINVAL;
	if (copy_from_user(&a, uarg, size))
		return -EFAULT;
	if (a.hdr.struct_size != size)
		return -EINVAL;
	if (_IOC_NR(cmd) == _IOC_NR(NPRDMA_IOC_VERSION)) {
		a.version.module_version = NPRDMA_ABI_VERSION;
		a.version.features = NPRDMA_FEATURE_HUGE | NPRDMA_FEATURE_RING |
				     NPRDMA_FEATURE_RESOLVE | NPRDMA_FEATURE_DMA;
		return copy_to_user(uarg, &a, size) ? -EFAULT : 0;
	}
	if (a.hdr.abi_version != NPRDMA_ABI_VERSION)
		return -EPROTO;

	if (mutex_lock_killable(&ctx->mutex))
		return -EINTR;
	switch (_IOC_NR(cmd)) {
	case _IOC_NR(NPRDMA_IOC_REGISTER):
		a.reg.region_id = 0;
		a.reg.table_offset = 0;
		a.reg.table_entries = 0;
		a.reg.reserved = 0;
		ret = npg_register(ctx, &a.reg);
		break;
	case _IOC_NR(NPRDMA_IOC_UNREGISTER): {
		struct npg_region *r = npg_find(ctx, a.unreg.region_id);

		a.unreg.reserved = 0;
		a.unreg.status = r ? NPRDMA_ST_OK : NPRDMA_ST_UNKNOWN_REGION;
		if (r)
			npg_region_destroy(ctx, r);
		ret = 0;
		break;
	}
	case _IOC_NR(NPRDMA_IOC_FAULT_IN):
		a.fault.pages_mapped = 0;
		a.fault.minor_faults = 0;
		a.fault.major_faults = 0;
		a.fault.huge_blocks = 0;
		ret = npg_fault_in(ctx, &a.fault);
		break;
	case _IOC_NR(NPRDMA_IOC_RING_SETUP):
		a.ring.ring_offset = 0;
		a.ring.ring_bytes = 0;
		a.ring.reserved = 0;
		ret = npg_ring_setup(ctx, &a.ring);
		break;
	case _IOC_NR(NPRDMA_IOC_DMA_ATTACH):
		a.attach.pgsize_bitmap = 0;
		a.attach.aperture_end = 0;
		a.attach.pci_address = 0;
		a.attach.reserved = 0;
		ret = npg_dma_attach(ctx, &a.attach);
		break;
	case _IOC_NR(NPRDMA_IOC_DMA):
		a.dma.pages = 0;
		a.dma.present_before = 0;
		memset(a.dma.version_before, 0, sizeof(a.dma.version_before));
		memset(a.dma.version_after, 0, sizeof(a.dma.version_after));
		a.dma.elapsed_ns = 0;
		a.dma.stale = 0;
		ret = npg_dma(ctx, &a.dma);
		break;
	default: /* NPRDMA_IOC_RESOLVE */
		a.resolve.pfn = 0;
		a.resolve.mapping_start = 0;
		a.resolve.order = 0;
		a.resolve.kind = 0;
		a.resolve.version = 0;
		ret = npg_resolve(ctx, &a.resolve);
		break;
	}
	mutex_unlock(&ctx->mutex);
	if (ret)
		return ret;
	return copy_to_user(uarg, &a, size) ? -EFAULT : 0;
}

static void npg_vm_open(struct vm_area_struct *vma)
{
	struct npg_buf *b = vma->vm_private_data;

	kref_get(&b->ref);
}

static void npg_vm_close(struct vm_area_struct *vma)
{
	npg_buf_put(vma->vm_private_data);
}

static const struct vm_operations_struct npg_vm_ops = {
	.open = npg_vm_open,
	.close = npg_vm_close,
};

/*
 * A read fault on a mapped table: its page, allocated (zeroed) on first use, as
 * kernel/relay.c relay_buf_fault() hands out its buffer pages. Runs under the mmap lock.
 */
static vm_fault_t npg_table_fault(struct vm_fault *vmf)
{
	struct npg_buf *b = vmf->vma->vm_private_data;
	struct page *p;

	if (vmf->pgoff < b->pgoff || vmf->pgoff - b->pgoff >= b->bytes >> PAGE_SHIFT)
		return VM_FAULT_SIGBUS;
	p = npg_buf_page(b, vmf->pgoff - b->pgoff, true);
	if (!p)
		return VM_FAULT_OOM;
	get_page(p);
	vmf->page = p;
	return 0;
}

static const struct vm_operations_struct npg_table_vm_ops = {
	.open = npg_vm_open,
	.close = npg_vm_close,
	.fault = npg_table_fault,
};

static void npg_vm_flags(struct vm_area_struct *vma, vm_flags_t set, vm_flags_t clear)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_mod(vma, set, clear);
#else
	vma->vm_flags = (vma->vm_flags | set) & ~clear;
#endif
}

/*
 * Maps a region's table (read-only) or the ring (read-write) at the offset IOC_REGISTER or
 * IOC_RING_SETUP returned. Runs under the mmap lock: takes only lookup_lock and ring_lock.
 */
static int npg_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct npg_ctx *ctx = file->private_data;
	unsigned long size = vma->vm_end - vma->vm_start;
	struct npg_buf *b = NULL;
	struct npg_region *r;
	int ret;

	if (vma->vm_mm != ctx->mm)
		return -EBADF;
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	/* The reference is taken under the lock: an unregister may drop the region's own. */
	spin_lock(&ctx->lookup_lock);
	list_for_each_entry(r, &ctx->regions, node) {
		if (r->table->pgoff == vma->vm_pgoff) {
			b = r->table;
			kref_get(&b->ref);
			break;
		}
	}
	spin_unlock(&ctx->lookup_lock);
	if (!b) {
		/* The ring is set once, under ring_lock, and lives as long as the context. */
		spin_lock_irq(&ctx->ring_lock);
		if (ctx->ring && ctx->ring->pgoff == vma->vm_pgoff) {
			b = ctx->ring;
			kref_get(&b->ref);
		}
		spin_unlock_irq(&ctx->ring_lock);
	}
	if (!b)
		return -EINVAL;
	ret = -EINVAL;
	if (size > b->bytes)
		goto put;
	if (!b->writable) {
		ret = -EACCES;
		if (vma->vm_flags & VM_WRITE)
			goto put;
		npg_vm_flags(vma, 0, VM_MAYWRITE);
	}
	npg_vm_flags(vma, VM_DONTEXPAND | VM_DONTDUMP | VM_DONTCOPY, 0);
	vma->vm_private_data = b; /* the VMA's reference, dropped by npg_vm_close */
	if (!b->mem) {
		/* A sparse table: its pages are mapped as user space reads them. */
		vma->vm_ops = &npg_table_vm_ops;
		return 0;
	}
	ret = remap_vmalloc_range(vma, b->mem, 0);
	if (ret)
		goto put;
	vma->vm_ops = &npg_vm_ops;
	return 0;
put:
	npg_buf_put(b);
	return ret;
}

static const struct file_operations npg_fops = {
	.owner = THIS_MODULE,
	.open = npg_open,
	.release = npg_release,
	.unlocked_ioctl = npg_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = npg_mmap,
	.llseek = noop_llseek,
};

/*
 * /sys/class/misc/nprdma-glue/stats: live contexts and regions, teardowns done after an mm
 * went away, fault passes retried because of a colliding invalidation, transfers completed
 * and reported stale, pages pointed back at a scratch page, and failed IOMMU maps.
 */
static ssize_t stats_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf,
			  "contexts %d regions %d teardowns %d retries %ld dmas %ld stale %ld scratched %ld iommu_errors %ld device_faults %ld table_pages %ld\n",
			  atomic_read(&npg_contexts), atomic_read(&npg_regions),
			  atomic_read(&npg_teardowns), atomic_long_read(&npg_retries),
			  atomic_long_read(&npg_dmas), atomic_long_read(&npg_stale),
			  atomic_long_read(&npg_scratched), atomic_long_read(&npg_iommu_errors),
			  atomic_long_read(&npg_device_faults), atomic_long_read(&npg_table_pages));
}
static DEVICE_ATTR_RO(stats);

static struct attribute *npg_attrs[] = {
	&dev_attr_stats.attr,
	NULL,
};
ATTRIBUTE_GROUPS(npg);

static struct miscdevice npg_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = NPRDMA_DEVICE_NAME,
	.fops = &npg_fops,
	.groups = npg_groups,
	.mode = 0600,
};

static int __init npg_init(void)
{
	int ret;

	/* The ABI counts 4 KiB pages and 2 MiB blocks. */
	BUILD_BUG_ON(PAGE_SHIFT != NPG_PAGE_SHIFT);
	npg_wq = alloc_workqueue("nprdma", 0, 0);
	if (!npg_wq)
		return -ENOMEM;
	ret = misc_register(&npg_misc);
	if (ret)
		goto wq;
	ret = pci_register_driver(&npg_edu_driver);
	if (ret)
		goto misc;
	return 0;
misc:
	misc_deregister(&npg_misc);
wq:
	destroy_workqueue(npg_wq);
	return ret;
}

static void __exit npg_exit(void)
{
	/* No file is open (each holds a module reference): no device has an owner. */
	misc_deregister(&npg_misc);
	pci_unregister_driver(&npg_edu_driver);
	destroy_workqueue(npg_wq); /* runs any teardown still queued */
}

module_init(npg_init);
module_exit(npg_exit);
MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("nprdma: device access to unpinned memory (MMU interval notifiers and HMM)");
MODULE_AUTHOR("the nprdma authors");
