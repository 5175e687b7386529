// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * nprdma.ko: the invalidation ring (IOC_RING_SETUP), one per context, mapped read-write by
 * user space.
 *
 * Fields of struct npg_ctx:
 *   - ring_lock (spinlock, irqsave): the ring's private producer and dropped counters (user
 *     space can write the shared header; the module never reads its own counters back from
 *     it) and the records. Taken by invalidation callbacks, after (never inside) a region's
 *     lock, and by the IOMMU fault handler (hard interrupt, devfault.c), which takes no other
 *     lock. It is the only lock taken in interrupt context, so it is always taken with
 *     interrupts off.
 *   - ring, ring_entries: set once under ring_lock by IOC_RING_SETUP, freed with the context.
 *   - ring_producer, ring_dropped: ring_lock.
 *
 * A record is never overwritten: a full ring counts the record in `dropped`, which user space
 * sees and answers by resynchronising from the tables.
 */

#include "nprdma.h"

/*
 * Publishes one record, or counts it in `dropped` when the ring is full: a record is never
 * overwritten. The consumer index lives in user-writable memory, so it is only read and
 * never trusted: any value that does not leave a free slot counts as full. Takes ring_lock.
 */
void npg_post(struct npg_ctx *ctx, u64 region, unsigned long start, unsigned long len,
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

u32 npg_cause(enum mmu_notifier_event event)
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

long npg_ring_setup(struct npg_ctx *ctx, struct nprdma_ring_setup_args *a)
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
