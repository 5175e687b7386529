// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * nprdma.ko: fault-in and resolution (IOC_FAULT_IN, IOC_RESOLVE).
 *
 * hmm_range_fault() (mm/hmm.c) inside the mmu_interval_read_begin()/read_retry() loop, the
 * pattern Documentation/mm/hmm.rst describes and lib/test_hmm.c (dmirror_range_fault) uses;
 * hmm_range_fault() reads the page tables without taking page references. The answer is
 * recorded in the region's table (and the device's IOMMU domain) under the region's lock,
 * after a successful read_retry check.
 *
 * Locking: every function here runs with ctx->mutex held (the ioctl path). The table pages a
 * record will write are allocated with no spinlock held (npg_table_prepare, may sleep): the
 * pages' own before the loop, a 2 MiB block's after hmm_range_fault() reported the block;
 * the mmap lock is taken for read around hmm_range_fault() only; then region->lock (a
 * spinlock) around the retry check and the record, which allocates nothing. No page reference is held at any
 * time: the frame numbers are valid until the next invalidation, which the versions report.
 */

#include "nprdma.h"

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

	/* The table pages the record below writes for these pages. */
	ret = npg_table_prepare(r, first, n);
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
		/*
		 * With `whole` (n == 1), a page mapped by a 2 MiB block marks the whole block: its
		 * table pages are allocated once the answer says so, not for every 4 KiB page. This
		 * may sleep; an invalidation meanwhile is caught by the retry check below.
		 */
		if (whole && (pfns[0] & HMM_PFN_VALID) &&
		    hmm_pfn_to_map_order(pfns[0]) >= NPG_HUGE_ORDER && npg_block_inside(r, start)) {
			unsigned long block = start & ~(NPG_HUGE_SIZE - 1);

			ret = npg_table_prepare(r, (block - r->start) >> NPG_PAGE_SHIFT,
						NPG_HUGE_SIZE >> NPG_PAGE_SHIFT);
			if (ret)
				return ret;
		}
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

long npg_fault_in(struct npg_ctx *ctx, struct nprdma_fault_in_args *a)
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

long npg_resolve(struct npg_ctx *ctx, struct nprdma_resolve_args *a)
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
