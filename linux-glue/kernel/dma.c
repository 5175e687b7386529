// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * nprdma.ko: the IOMMU half (ABI 3, docs/linux-glue.md "The IOMMU half"): one bound
 * DMA-capable PCI device, QEMU's edu (hw/misc/edu.c), and the unmanaged IOMMU domain of the
 * file that attached it.
 *
 * The PCI driver sets driver_managed_dma, so the driver core does not claim the device's
 * default DMA domain for it (include/linux/pci.h). IOC_DMA_ATTACH gives the device to one
 * open file: an unmanaged IOMMU domain (iommu_domain_alloc, iommu_attach_device,
 * drivers/iommu/iommu.c) in which IOVA = the process's virtual address. Every 4 KiB page of
 * every region of that file is mapped in it at all times, either to its frame (the table
 * entry is present) or to the file's scratch page (absent), so the device never reaches an
 * unmapped IOVA of a region (SMMUv3 under Linux terminates such an access; nothing stalls
 * PCIe). The fault path maps frames after a successful mmu_interval_read_retry() under the
 * region's lock; the invalidate callback points the range's present pages back at the
 * scratch page and syncs the IOTLB before it returns, so the device can never reach a page
 * the mm frees after the callback. IOC_DMA reports the versions of the pages it touched
 * before and after the transfer: a page absent at the start or changed before the completion
 * means the device may have used the scratch page and user space re-sends (NP-RDMA's
 * scheme). IOMMU page tables are 4 KiB leaves only: a region's leaf tables are allocated when
 * its scratch mapping is made (sleeping), and later replacements (iommu_unmap_fast of one
 * page, then iommu_map_atomic into the existing leaf table) allocate nothing in the
 * callbacks.
 *
 * struct npg_dev (the bound edu; at most one)
 *   - npg_dev_mutex (this file's mutex): npg_dev, dev->owner and ctx->dev. Held by attach,
 *     detach, IOC_DMA (across the wait for the completion: edu has one DMA engine), probe
 *     and remove. Order: ctx->mutex before npg_dev_mutex.
 *   - busy: a transfer was started and its completion interrupt not seen. Written by the
 *     starter (npg_dev_mutex held, device idle) and by the hard interrupt handler; read with
 *     READ_ONCE in wait_event conditions (wake_up/wait_event order the accesses). The
 *     handler takes no lock.
 *
 * DMA fields of struct npg_ctx: domain, scratch and dev are set by IOC_DMA_ATTACH under
 * ctx->mutex (dev also under npg_dev_mutex) and cleared at release; remove() clears dev
 * under npg_dev_mutex when the device goes away first. requester_id is written before the
 * fault handler is installed and read by it with READ_ONCE (devfault.c).
 */

#include "nprdma.h"

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
int npg_iommu_point(struct npg_region *r, unsigned long iova, phys_addr_t pa, int prot,
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
int npg_iommu_map_scratch(struct npg_ctx *ctx, unsigned long start, unsigned long npages)
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
 * Points the present pages of [first, first + n) of r back at the scratch page and syncs the
 * IOTLB, so the device cannot reach their frames once this returns. Caller holds r->lock.
 */
void npg_iommu_scratch_range(struct npg_region *r, unsigned long first, unsigned long n)
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
void npg_ctx_quiesce(struct npg_ctx *ctx)
{
	mutex_lock(&npg_dev_mutex);
	if (ctx->dev)
		npg_dev_wait_idle(ctx->dev);
	mutex_unlock(&npg_dev_mutex);
}

/*
 * Gives the device back to its default domain (after any transfer ends) and frees the
 * file's domain and scratch page. Idempotent. Caller holds ctx->mutex.
 */
void npg_dma_detach(struct npg_ctx *ctx)
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

long npg_dma_attach(struct npg_ctx *ctx, struct nprdma_dma_attach_args *a)
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

long npg_dma(struct npg_ctx *ctx, struct nprdma_dma_args *a)
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

struct pci_driver npg_edu_driver = {
	.name = "nprdma-edu",
	.id_table = npg_edu_ids,
	.probe = npg_edu_probe,
	.remove = npg_edu_remove,
	/* DMA goes through our own unmanaged domain, never the DMA API's default one. */
	.driver_managed_dma = true,
};
