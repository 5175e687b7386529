//! Host-side buses: a device model behind a lock, and a recorder (`std` feature).
//!
//! A [`RegisterModel`] is the device side of the seam: it is called for every access, in
//! order, so it can implement what plain memory cannot (write-1-to-clear, read-only fields,
//! doorbells that start work, read side effects). [`ModelBus`] makes a model usable as a
//! [`RegisterBus`] from any number of threads; a test can also lock it to inspect or poke the
//! device state.

use std::sync::{Mutex, MutexGuard};

use crate::barrier::Barrier;
use crate::journal::{self, Event};
use crate::regs::{AccessWidth, RegisterBus};

/// The device side of a register window.
pub trait RegisterModel {
    /// Size of the register window in bytes.
    fn size(&self) -> usize;
    /// Handles a read; returns the value (zero-extended to 64 bits).
    fn read(&mut self, offset: usize, width: AccessWidth) -> u64;
    /// Handles a write of the low `width` bits of `value`.
    fn write(&mut self, offset: usize, width: AccessWidth, value: u64);
    /// Sees a barrier the driver issued on this bus. Models use it to check that memory the
    /// device will read was published before a doorbell. The default ignores it.
    fn barrier(&mut self, _kind: Barrier) {}
}

/// A [`RegisterModel`] made into a thread-safe [`RegisterBus`].
#[derive(Debug, Default)]
pub struct ModelBus<M> {
    model: Mutex<M>,
}

impl<M: RegisterModel> ModelBus<M> {
    /// Wraps a model.
    pub fn new(model: M) -> Self {
        Self {
            model: Mutex::new(model),
        }
    }

    /// Locks the model, e.g. to inspect its state in a test or to let it make progress.
    /// A poisoned lock (a panicking test thread) is recovered: the model state is still the
    /// best evidence of what happened.
    pub fn lock(&self) -> MutexGuard<'_, M> {
        self.model
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Unwraps the model.
    pub fn into_inner(self) -> M {
        self.model
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<M: RegisterModel> RegisterBus for ModelBus<M> {
    fn read(&self, offset: usize, width: AccessWidth) -> u64 {
        self.lock().read(offset, width) & width.mask()
    }
    fn write(&self, offset: usize, width: AccessWidth, value: u64) {
        self.lock().write(offset, width, value & width.mask())
    }
    fn size(&self) -> usize {
        self.lock().size()
    }
    fn barrier(&self, kind: Barrier) {
        crate::barrier::issue(kind);
        self.lock().barrier(kind);
    }
}

/// Wraps any bus and records each access in this thread's [`journal`].
#[derive(Debug)]
pub struct RecordingBus<B> {
    inner: B,
    label: &'static str,
}

impl<B: RegisterBus> RecordingBus<B> {
    /// Records accesses to `inner` under `label`.
    pub fn new(label: &'static str, inner: B) -> Self {
        Self { inner, label }
    }

    /// The wrapped bus.
    pub fn inner(&self) -> &B {
        &self.inner
    }
}

impl<B: RegisterBus> RegisterBus for RecordingBus<B> {
    fn read(&self, offset: usize, width: AccessWidth) -> u64 {
        let value = self.inner.read(offset, width);
        journal::record(Event::Read {
            bus: self.label,
            offset,
            width,
            value,
        });
        value
    }
    fn write(&self, offset: usize, width: AccessWidth, value: u64) {
        journal::record(Event::Write {
            bus: self.label,
            offset,
            width,
            value,
        });
        self.inner.write(offset, width, value)
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn barrier(&self, kind: Barrier) {
        // `inner.barrier` issues (and journals) the barrier itself.
        self.inner.barrier(kind)
    }
}
