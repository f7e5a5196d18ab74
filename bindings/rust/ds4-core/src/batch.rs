//! Batches: one forward step over several sessions of a model (`ds4_bridge_batch_*`).
use crate::error::{check, Error, Result};
use crate::model::Model;
use crate::session::Session;
use ds4_sys as sys;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

/// Counters of a batch (`ds4_bridge_batch_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    pub steps: u64,
    pub rows: u64,
    pub sessions: u64,
    pub failed: u64,
}

/// Runs decode tokens of some sessions and prefill chunks of others in one step. It borrows
/// its model (dropped before it) and each call's sessions mutably, so a session cannot
/// appear twice in a step.
pub struct Batch<'m> {
    raw: NonNull<sys::ds4_bridge_batch>,
    _model: PhantomData<&'m Model>,
}

impl<'m> Batch<'m> {
    pub(crate) fn new(m: &'m Model) -> Result<Batch<'m>> {
        let mut out = ptr::null_mut();
        check("create batch", |e, n| {
            // SAFETY: the model handle is live while m is borrowed.
            unsafe { sys::ds4_bridge_batch_create(&mut out, m.raw(), e, n) }
        })?;
        let raw = NonNull::new(out).ok_or_else(|| Error::new("create batch: no handle returned"))?;
        Ok(Batch { raw, _model: PhantomData })
    }

    /// Appends `tokens` to each row's session in one step (1..=prefill_cap tokens each);
    /// afterwards every session's logits are those after its last token, as if alone.
    pub fn eval(&mut self, rows: &mut [(&mut Session<'m>, &[i32])]) -> Result<()> {
        let sessions: Vec<*mut sys::ds4_bridge_session> = rows.iter().map(|r| r.0.as_raw()).collect();
        let counts: Vec<i32> = rows.iter().map(|r| r.1.len() as i32).collect();
        let tokens: Vec<i32> = rows.iter().flat_map(|r| r.1.iter().copied()).collect();
        check("batch eval", |e, n| {
            // SAFETY: the arrays hold rows.len() sessions/counts and sum(counts) tokens, all
            // alive for the call; the sessions are live and exclusively borrowed.
            unsafe {
                sys::ds4_bridge_batch_eval(
                    self.raw.as_ptr(),
                    sessions.as_ptr(),
                    counts.as_ptr(),
                    rows.len() as i32,
                    tokens.as_ptr(),
                    e,
                    n,
                )
            }
        })
    }

    pub fn stats(&self) -> Result<BatchStats> {
        let mut s = sys::ds4_bridge_batch_stats_t { steps: 0, rows: 0, sessions: 0, failed: 0 };
        check("batch stats", |e, n| {
            // SAFETY: live handle; s writable.
            unsafe { sys::ds4_bridge_batch_stats(self.raw.as_ptr(), &mut s, e, n) }
        })?;
        Ok(BatchStats { steps: s.steps, rows: s.rows, sessions: s.sessions, failed: s.failed })
    }
}

impl<'m> Drop for Batch<'m> {
    fn drop(&mut self) {
        // SAFETY: from a successful batch_create, freed only here, before its model ('m).
        unsafe { sys::ds4_bridge_batch_free(self.raw.as_ptr()) }
    }
}
