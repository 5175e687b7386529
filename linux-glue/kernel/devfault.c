// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * nprdma.ko: forwarding of IOMMU faults to user space (ABI 4).
 *
 * Locking: the handler runs in hard interrupt context (the SMMU driver's context-fault
 * interrupt); it takes only ctx->ring_lock, through npg_post() (ring.c), with interrupts off,
 * and reads ctx->requester_id with READ_ONCE. The context outlives the handler: the domain
 * is freed (and with it the handler) before the context is (dma.c npg_dma_detach).
 */

#include "nprdma.h"

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
int npg_iommu_fault(struct iommu_domain *domain, struct device *dev, unsigned long iova,
		    int flags, void *token)
{
	struct npg_ctx *ctx = token;
	u32 rflags = (flags & IOMMU_FAULT_WRITE) ? NPRDMA_RECORD_DEVICE_WRITE : 0;

	atomic_long_inc(&npg_device_faults);
	npg_post(ctx, 0, iova, 0, NPRDMA_CAUSE_DEVICE_FAULT, rflags, READ_ONCE(ctx->requester_id));
	return 0;
}
