//! The zDMA driver against the zDMA model, with the MMU-500 model translating.

mod common;

use common::*;
use dma_engine::DmaError;
use dma_engine::zdma::{ChannelStatus, Completion, Transfer};
use hal::regs::{AccessWidth, RegisterBus};
use proptest::prelude::*;
use sim::soc::Soc;
use smmu_driver::v2::FaultModel;

#[test]
fn a_copy_with_the_smmu_disabled_goes_to_physical_addresses() {
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let src = page_with(dram, 2, |i| (i * 31 % 256) as u8);
    let dst = page_with(dram, 2, |_| 0);
    // After reset the model bypasses everything (sCR0.CLIENTPD); no SMMU driver here.
    let mut ch = channel(&soc, 3);
    let t = Transfer {
        src: phys(&src).as_u64() + 5,
        dst: phys(&dst).as_u64() + 1,
        len: 5000,
    };
    assert_eq!(ch.transfer(&t), Ok(Completion { bytes: 5000 }));
    assert_eq!(&contents(&dst, 5001)[1..], &contents(&src, 5005)[5..]);
    assert_eq!(ch.poll(), Ok(ChannelStatus::Idle));
    // GDMA bursts: 16 beats of 16 bytes, never across a 4 KiB page.
    let m = soc.lock();
    assert_eq!(m.gdma[3].stats().completed, 1);
    assert_eq!(m.gdma[3].stats().started, 1);
}

#[test]
fn the_interrupt_accounting_counter_flags_its_overflow() {
    let soc = Soc::zynqmp().unwrap();
    let dram = &**soc.dram();
    let src = page_with(dram, 1, |i| i as u8);
    let dst = page_with(dram, 1, |_| 0);
    // The driver reads (and so clears) IRQ_DST_ACCT only at init: 256 copies later the
    // 8-bit counter has wrapped, which the channel flags in ISR.IRQ_DST_ACCT_ERR (bit 5).
    let mut ch = channel(&soc, 2);
    let t = Transfer {
        src: phys(&src).as_u64(),
        dst: phys(&dst).as_u64(),
        len: 16,
    };
    for _ in 0..255 {
        ch.transfer(&t).unwrap();
        assert_eq!(ch.bus().read(0x100, AccessWidth::U32) & (1 << 5), 0);
    }
    // The 256th copy started by hand, so that nothing acknowledges its ISR bits.
    let w = soc.gdma_window(2).unwrap();
    let set = |offset: usize, value: u64| w.write(offset, AccessWidth::U32, value);
    set(0x128, t.src & 0xffff_ffff);
    set(0x12c, t.src >> 32);
    set(0x130, 16);
    set(0x138, t.dst & 0xffff_ffff);
    set(0x13c, t.dst >> 32);
    set(0x140, 16);
    set(0x144, 1 << 2); // DST_WORD3.INTR
    set(0x200, 1); // CTRL2.EN
    assert_ne!(
        w.read(0x100, AccessWidth::U32) & (1 << 5),
        0,
        "IRQ_DST_ACCT_ERR"
    );
}

#[test]
fn the_channel_rejects_what_it_does_not_implement() {
    let soc = Soc::zynqmp().unwrap();
    let win = soc.gdma_window(0).unwrap();
    // Scatter-gather mode is not modelled: starting in it flags INV_APB and does nothing.
    win.write(0x110, AccessWidth::U32, 1 << 6);
    win.write(0x200, AccessWidth::U32, 1);
    assert_eq!(win.read(0x100, AccessWidth::U32), 1, "ISR.INV_APB");
    assert_eq!(win.read(0x11c, AccessWidth::U32), 0, "STATUS idle");
    // A byte access and an unimplemented offset are decode errors too (QEMU: 32-bit only).
    win.write(0x100, AccessWidth::U32, 1);
    let _ = win.read(0x100, AccessWidth::U8);
    assert_eq!(win.read(0x100, AccessWidth::U32), 1);
    win.write(0x100, AccessWidth::U32, 1);
    let _ = win.read(0x300, AccessWidth::U32);
    assert_eq!(win.read(0x100, AccessWidth::U32), 1);
    assert_eq!(soc.lock().gdma[0].stats().invalid_accesses, 3);

    // The driver's init puts the channel back in simple mode (and clears ISR).
    let mut ch = channel(&soc, 0);
    let t = Transfer {
        src: 0x4000_0000,
        dst: 0x4000_1000,
        len: 16,
    };
    assert_eq!(ch.transfer(&t), Ok(Completion { bytes: 16 }));
    // An invalid access reported with a completion is an error the driver does not hide.
    ch.start(&t).unwrap();
    let _ = win.read(0x3f0, AccessWidth::U32);
    assert_eq!(ch.wait(), Err(DmaError::InvalidRegisterAccess));
}

#[test]
fn init_programs_the_axi_cache_attributes_in_the_model() {
    use dma_engine::zdma::{ZdmaChannel, ZdmaConfig};
    let soc = Soc::zynqmp().unwrap();
    let attrs = |n: usize| {
        let w = soc.gdma_window(n).unwrap();
        (
            w.read(0x120, AccessWidth::U32),
            w.read(0x124, AccessWidth::U32),
        )
    };
    // The model's reset values (UG1087): DATA_ATTR 0x0483_D20F, DSCR_ATTR 0.
    assert_eq!(attrs(0), (0x0483_d20f, 0));
    let coherent = ZdmaConfig {
        coherent: true,
        ..ZdmaConfig::DEFAULT
    };
    let window = || soc.gdma_window(0).unwrap();
    ZdmaChannel::new(window(), hal::delay::NoDelay::default(), coherent)
        .unwrap()
        .init()
        .unwrap();
    // ARCACHE = AWCACHE = 0xF; DSCR_ATTR.AXCOHRNT | AXCACHE 0xF (Linux zynqmp_dma_init).
    assert_eq!(attrs(0), (0x07c3_df0f, 0x1f0));
    // A later non-coherent owner puts the reset attributes back.
    let mut ch = ZdmaChannel::new(
        window(),
        hal::delay::NoDelay::default(),
        ZdmaConfig::DEFAULT,
    )
    .unwrap();
    ch.init().unwrap();
    assert_eq!(attrs(0), (0x0483_d20f, 0));
    // The burst length is untouched: copies still work, 16-beat bursts.
    let dram = &**soc.dram();
    let src = page_with(dram, 1, |i| i as u8);
    let dst = page_with(dram, 1, |_| 0);
    let t = Transfer {
        src: phys(&src).as_u64(),
        dst: phys(&dst).as_u64(),
        len: 4096,
    };
    assert_eq!(ch.transfer(&t), Ok(Completion { bytes: 4096 }));
    assert_eq!(contents(&dst, 4096), contents(&src, 4096));
    assert_eq!(soc.lock().gdma[0].stats().invalid_accesses, 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any copy within mapped pages through a translating context equals a memcpy, and
    /// TOTAL_BYTE counts every byte.
    #[test]
    fn translated_copies_equal_memcpy(src_off in 0u64..4096, dst_off in 0u64..4096, len in 1u32..9000) {
        let soc = Soc::zynqmp().unwrap();
        let dram = &**soc.dram();
        let mut smmu = smmu(&soc, ZYNQMP_SMMU);
        let mut table = table(dram);
        let src = page_with(dram, 4, |i| (i.wrapping_mul(2654435761) >> 13) as u8);
        let dst = page_with(dram, 4, |_| 0xcc);
        map(&mut table, SRC, &src, 4);
        map(&mut table, DST, &dst, 4);
        let _cb = context(&mut smmu, &table, FaultModel::Stall, true, &[GDMA0]);
        let mut ch = channel(&soc, 0);
        let t = Transfer { src: SRC + src_off, dst: DST + dst_off, len };
        prop_assert_eq!(ch.transfer(&t), Ok(Completion { bytes: len }));
        let s = contents(&src, 4 * 4096);
        let d = contents(&dst, 4 * 4096);
        let (so, doff, n) = (src_off as usize, dst_off as usize, len as usize);
        prop_assert_eq!(&d[doff..doff + n], &s[so..so + n]);
        prop_assert!(d[..doff].iter().all(|&b| b == 0xcc));
        prop_assert!(d[doff + n..].iter().all(|&b| b == 0xcc));
        prop_assert_eq!(soc.lock().smmu.stats().context_faults, 0);
        prop_assert_eq!(ch.poll(), Ok(ChannelStatus::Idle));
    }
}
