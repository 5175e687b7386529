// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * nprdma.ko: regions, their mmu_interval_notifier and their page-state table.
 *
 * A region of a context's mm is registered WITHOUT pinning: an mmu_interval_notifier over its
 * range (include/linux/mmu_notifier.h), which only links the range into the mm's interval
 * tree, plus a page-state table that user space maps read-only (buf.c). Nothing here takes a
 * page reference: no get_user_pages() or pin_user_pages().
 *
 * struct npg_region
 *   - node: in ctx->regions, changed under ctx->mutex and ctx->lookup_lock.
 *   - notifier: inserted at register, removed at unregister, teardown or release, always
 *     under ctx->mutex and with no spinlock held (the removal may sleep until a running
 *     invalidation ends). Once removed, no callback runs.
 *   - lock (spinlock): the table's entries and generation and the notifier sequence
 *     (mmu_interval_set_seq). The invalidation callback takes only this lock and, after
 *     dropping it, ctx->ring_lock (ring.c), so it never sleeps and is valid whether or not
 *     mmu_notifier_range_blockable() says it may block; it never has to return false.
 *   - domain: the IOMMU domain the region is mapped in (NULL: none), written under lock, so
 *     the callbacks, which hold the lock, see it set only once its scratch mapping exists
 *     (dma.c).
 *   - table: the npg_buf with the table; the region holds one reference.
 *   - id, start, npages, access: set at register, before the region is published.
 *
 * The invalidate callback bumps the versions of the range's entries and, for a region
 * mapped for a device, points their IOVAs back at the scratch page and syncs the IOTLB
 * (dma.c) before it returns; then it posts a ring record (ring.c).
 */

#include "nprdma.h"

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
u64 *npg_entry(const struct npg_region *r, unsigned long i)
{
	size_t off = npg_entry_off(i);
	struct page *p = xa_load(&r->table->pages, off >> PAGE_SHIFT);

	return p ? (u64 *)((char *)page_address(p) + (off & ~PAGE_MASK)) : NULL;
}

/* The first entry index after i that lies in the next table page. */
unsigned long npg_next_table_page(unsigned long i)
{
	size_t next = ((npg_entry_off(i) >> PAGE_SHIFT) + 1) << PAGE_SHIFT;

	return (next - sizeof(struct nprdma_table_header)) / sizeof(u64);
}

/*
 * Allocates the table pages of entries [first, first + n) that do not exist yet, so the
 * fault path can record them under r->lock. Caller holds ctx->mutex (may sleep).
 */
int npg_table_prepare(struct npg_region *r, unsigned long first, unsigned long n)
{
	unsigned long i;

	for (i = first; i < first + n; i = npg_next_table_page(i))
		if (!npg_buf_page(r->table, npg_entry_off(i) >> PAGE_SHIFT, true))
			return -ENOMEM;
	return 0;
}

unsigned long npg_region_end(const struct npg_region *r)
{
	return r->start + (r->npages << NPG_PAGE_SHIFT);
}

/*
 * Marks pages [first, first + n) absent and bumps their versions, and the generation before
 * them (a reader comparing generations sees the change no later than the entries').
 * Caller holds r->lock.
 */
void npg_table_invalidate(struct npg_region *r, unsigned long first, unsigned long n)
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

/*
 * Sets page i's flags and, for a region mapped for the device, points its IOVA at frame
 * `pfn` (read-write if WRITABLE, else read-only); its version is bumped when the flags
 * change. If the IOMMU refuses the mapping the page stays absent. Caller holds r->lock.
 */
u32 npg_table_set(struct npg_region *r, unsigned long i, u64 flags, unsigned long pfn,
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

struct npg_region *npg_find(struct npg_ctx *ctx, u64 id)
{
	struct npg_region *r;

	lockdep_assert_held(&ctx->mutex);
	list_for_each_entry(r, &ctx->regions, node)
		if (r->id == id)
			return r;
	return NULL;
}

/* Unlinks, removes the notifier (may sleep), clears the table and drops the region. */
void npg_region_destroy(struct npg_ctx *ctx, struct npg_region *r)
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

void npg_destroy_all(struct npg_ctx *ctx)
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
u32 npg_check_vmas(struct mm_struct *mm, unsigned long start, unsigned long end,
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

u32 npg_range_status(u64 addr, u64 len)
{
	if (len == 0)
		return NPRDMA_ST_EMPTY;
	if ((addr | len) & ((1ULL << NPG_PAGE_SHIFT) - 1))
		return NPRDMA_ST_MISALIGNED;
	if (addr + len < addr)
		return NPRDMA_ST_OVERFLOW;
	return NPRDMA_ST_OK;
}

bool npg_access_valid(u32 access)
{
	return access == NPRDMA_ACCESS_READ || access == NPRDMA_ACCESS_WRITE;
}

long npg_register(struct npg_ctx *ctx, struct nprdma_register_args *a)
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
