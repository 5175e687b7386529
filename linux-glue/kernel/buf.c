// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * nprdma.ko: memory shared with user space (struct npg_buf) and its mmap: the invalidation
 * ring (dense) and the page-state tables (sparse).
 *
 * struct npg_buf
 *   - ref: kref: the owner (a region for a table, the context for the ring) plus one per VMA
 *     (vm_ops open/close), so an unregistered table stays valid while user space still maps
 *     it.
 *   - The ring is dense (vmalloc_user, remap_vmalloc_range at mmap). A page-state table is
 *     sparse: `pages` (an xarray, its own lock) holds a zeroed page for each 4 KiB of the
 *     table that has been needed, allocated (GFP_KERNEL) when the fault path is about to
 *     record a page in it (npg_table_prepare, ctx->mutex held, before r->lock) or when user
 *     space first reads it (npg_table_fault, under the mmap lock), and freed with the buffer.
 *     Readers under r->lock only xa_load(); an entry whose table page does not exist reads as
 *     absent with version 0, and invalidations skip it. Page 0 (the header) exists from
 *     registration. So a table costs 4 KiB per 2 MiB of region that was resolved or looked
 *     at, not 8 bytes per registered page.
 *   - bytes, writable, pgoff (the mmap offset): set before the buffer is published (under
 *     ctx->lookup_lock for a table, ctx->ring_lock for the ring), never changed after.
 *
 * npg_mmap runs under the mmap lock and takes only ctx->lookup_lock and ctx->ring_lock, each
 * just long enough to find the buffer and take a reference.
 */

#include "nprdma.h"

struct npg_buf *npg_buf_alloc(size_t bytes, bool writable)
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
atomic_long_t npg_table_pages = ATOMIC_LONG_INIT(0);

/*
 * Page `idx` of a sparse buffer, allocated zeroed if `alloc` (the caller may sleep); NULL if
 * it does not exist (or cannot be allocated).
 */
struct page *npg_buf_page(struct npg_buf *b, unsigned long idx, bool alloc)
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
struct npg_buf *npg_buf_alloc_sparse(size_t bytes)
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

void npg_buf_put(struct npg_buf *b)
{
	if (b)
		kref_put(&b->ref, npg_buf_free);
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
int npg_mmap(struct file *file, struct vm_area_struct *vma)
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
