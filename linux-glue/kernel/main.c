// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * nprdma.ko: the kernel half of linux-glue (docs/linux-glue.md, "The kernel module").
 * This file: the misc character device /dev/nprdma-glue, the context of each open file and
 * its lifetime, the ioctl dispatch, the sysfs stats and module init/exit. nprdma.h lists the
 * other objects of the module and the lock order.
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
 *   - lookup_lock (spinlock): the regions list, for the mmap lookup (buf.c). Writers hold
 *     mutex too; mmap holds only lookup_lock (mmap_lock -> lookup_lock).
 *   - dead: set by the first MMU_NOTIFY_RELEASE callback (the mm's exit_mmap, table.c):
 *     the teardown work then removes every region; release does the same at close.
 *   - the ring fields: ring.c; the DMA fields: dma.c.
 *
 * The module-wide counters (atomics, no lock) are defined here and shown by the stats file.
 *
 * Module unload: the misc device's fops have .owner = THIS_MODULE, so every open file
 * holds a module reference and delete_module refuses while one is open (each mapping of
 * the device holds the file). Teardown work runs on our own workqueue, npg_wq, which module
 * exit destroys (draining it) after deregistering the device and the PCI driver.
 */

#include "nprdma.h"

struct workqueue_struct *npg_wq;
atomic_t npg_contexts = ATOMIC_INIT(0);
atomic_t npg_regions = ATOMIC_INIT(0);
atomic_t npg_teardowns = ATOMIC_INIT(0);
/* hmm_range_fault() passes redone because an invalidation collided with them. */
atomic_long_t npg_retries = ATOMIC_LONG_INIT(0);
/* Transfers completed, those reported stale, pages pointed back at a scratch page. */
atomic_long_t npg_dmas = ATOMIC_LONG_INIT(0);
atomic_long_t npg_stale = ATOMIC_LONG_INIT(0);
atomic_long_t npg_scratched = ATOMIC_LONG_INIT(0);
/* iommu_map failures (the page is then left on the scratch page, or unmapped). */
atomic_long_t npg_iommu_errors = ATOMIC_LONG_INIT(0);
/* IOMMU faults the SMMU driver reported for a file's domain (posted to its ring). */
atomic_long_t npg_device_faults = ATOMIC_LONG_INIT(0);

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
