//! Sessions: one conversation's caches on a borrowed model.
use crate::error::{check, Error, Result};
use crate::model::Model;
use crate::payload;
use ds4_sys as sys;
use std::ffi::CString;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::ptr::NonNull;

/// A session borrows its model: it cannot outlive it, and it is neither Send nor Sync
/// (sessions are thread-affine, and those of one model share its thread pool).
///
/// Dropping the model while a session lives does not compile:
///
/// ```compile_fail
/// let model = ds4_core::Model::open("m.gguf").unwrap();
/// let session = model.session(64).unwrap();
/// drop(model); // error: cannot move out of `model` because it is borrowed
/// let _ = session.pos();
/// ```
///
/// Nor can a session move to another thread:
///
/// ```compile_fail
/// fn on_another_thread<T: Send>(_: T) {}
/// let model = ds4_core::Model::open("m.gguf").unwrap();
/// let session = model.session(64).unwrap();
/// on_another_thread(session); // error: `*mut ds4_bridge_session` cannot be sent between threads
/// ```
///
/// The same code in the right order compiles:
///
/// ```no_run
/// let model = ds4_core::Model::open("m.gguf").unwrap();
/// let session = model.session(64).unwrap();
/// let _ = session.pos();
/// drop(session);
/// drop(model);
/// ```
pub struct Session<'m> {
    raw: NonNull<sys::ds4_bridge_session>,
    model: *mut sys::ds4_bridge_model,
    _model: PhantomData<&'m Model>,
}

/// Sampling parameters (`ds4_bridge_session_sample`): greedy when temperature <= 0.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0 }
    }
}

/// What a prefill progress callback may do, at a durable chunk frontier: look at the part of
/// the prompt already in the caches and save the session's payload, synchronously. It cannot
/// outlive the callback and offers nothing that mutates the session.
pub struct PrefillCheckpoint<'a> {
    session: *mut sys::ds4_bridge_session,
    prompt: &'a [i32],
    current: usize,
    total: usize,
}

impl<'a> PrefillCheckpoint<'a> {
    /// Tokens of the prompt already evaluated.
    pub fn current(&self) -> usize {
        self.current
    }
    pub fn total(&self) -> usize {
        self.total
    }
    /// `prompt[..current]`: what the session holds at this frontier.
    pub fn prefix(&self) -> &'a [i32] {
        &self.prompt[..self.current]
    }
    /// The session's payload as it is at this frontier.
    pub fn payload(&self) -> Result<Vec<u8>> {
        save_mem(self.session)
    }
    /// Saves the payload at this frontier to `path` (durably: written, fsynced, renamed).
    pub fn save_payload(&self, path: impl AsRef<Path>) -> Result<()> {
        let p = c_string(path.as_ref())?;
        check("save payload", |e, n| {
            // SAFETY: the session is live for the whole sync call this checkpoint is inside;
            // saving reads the session only (the bridge allows it from the callback).
            unsafe { sys::ds4_bridge_session_save_payload(self.session, p.as_ptr(), e, n) }
        })
    }
}

fn c_string(p: &Path) -> Result<CString> {
    CString::new(p.to_string_lossy().into_owned()).map_err(|_| Error::new("path contains a NUL byte"))
}

fn save_mem(s: *mut sys::ds4_bridge_session) -> Result<Vec<u8>> {
    let mut size = 0u64;
    check("payload size", |e, n| {
        // SAFETY: s is a live session handle (callers hold it).
        unsafe { sys::ds4_bridge_session_payload_size(s, &mut size, e, n) }
    })?;
    let mut buf = vec![0u8; size as usize];
    let mut len = 0usize;
    check("save payload", |e, n| {
        // SAFETY: buf holds buf.len() writable bytes.
        unsafe { sys::ds4_bridge_session_save_payload_mem(s, buf.as_mut_ptr(), buf.len(), &mut len, e, n) }
    })?;
    buf.truncate(len);
    Ok(buf)
}

struct Progress<'a, F> {
    f: F,
    session: *mut sys::ds4_bridge_session,
    prompt: &'a [i32],
    panic: Option<String>,
}

// Runs the Rust callback; a panic is caught here, never unwinds into the engine, and is
// reported by sync_with_progress once the call has returned.
extern "C" fn progress_trampoline<F: FnMut(&PrefillCheckpoint<'_>)>(ud: *mut c_void, current: i32, total: i32) {
    // SAFETY: ud is the &mut Progress<F> that sync_with_progress passed for this call only.
    let p = unsafe { &mut *(ud as *mut Progress<'_, F>) };
    if p.panic.is_some() {
        return;
    }
    let cp = PrefillCheckpoint {
        session: p.session,
        prompt: p.prompt,
        current: (current.max(0) as usize).min(p.prompt.len()),
        total: total.max(0) as usize,
    };
    let f = &mut p.f;
    if let Err(e) = panic::catch_unwind(AssertUnwindSafe(|| f(&cp))) {
        let msg = e
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| e.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic".to_string());
        p.panic = Some(msg);
    }
}

impl<'m> Session<'m> {
    pub(crate) fn from_raw(raw: NonNull<sys::ds4_bridge_session>, m: &'m Model) -> Session<'m> {
        Session { raw, model: m.raw(), _model: PhantomData }
    }

    fn raw(&self) -> *mut sys::ds4_bridge_session {
        self.raw.as_ptr()
    }

    /// Makes the session hold exactly `tokens` (keeping the longest common prefix it can).
    pub fn sync(&mut self, tokens: &[i32]) -> Result<()> {
        check("sync", |e, n| {
            // SAFETY: live handle; tokens borrowed for the call.
            unsafe { sys::ds4_bridge_session_sync(self.raw(), tokens.as_ptr(), tokens.len() as i32, e, n) }
        })
    }

    /// sync, calling `f` at every durable chunk frontier with a [`PrefillCheckpoint`]. A
    /// panic in `f` is caught (it never crosses into the engine); the prefill still finishes
    /// and the panic comes back as `Err`.
    pub fn sync_with_progress<F: FnMut(&PrefillCheckpoint<'_>)>(&mut self, tokens: &[i32], f: F) -> Result<()> {
        let mut p = Progress { f, session: self.raw(), prompt: tokens, panic: None };
        let ud = &mut p as *mut Progress<'_, F> as *mut c_void;
        let r = check("sync", |e, n| {
            // SAFETY: ud points at p, alive for the call; the trampoline matches F.
            unsafe {
                sys::ds4_bridge_session_sync_cb(
                    self.raw(),
                    tokens.as_ptr(),
                    tokens.len() as i32,
                    Some(progress_trampoline::<F>),
                    ud,
                    e,
                    n,
                )
            }
        });
        r?;
        match p.panic {
            Some(msg) => Err(Error::new(format!("prefill progress callback panicked: {}", msg))),
            None => Ok(()),
        }
    }

    /// Evaluates one more token.
    pub fn eval(&mut self, token: i32) -> Result<()> {
        check("eval", |e, n| {
            // SAFETY: live handle.
            unsafe { sys::ds4_bridge_eval(self.raw(), token, e, n) }
        })
    }

    /// The most likely next token (lowest id on ties).
    pub fn argmax(&self) -> Result<i32> {
        let mut t = 0;
        check("argmax", |e, n| {
            // SAFETY: live handle; t writable.
            unsafe { sys::ds4_bridge_session_argmax(self.raw(), &mut t, e, n) }
        })?;
        Ok(t)
    }

    /// Samples the next token; `rng` is the caller's generator state and advances.
    pub fn sample(&self, s: &Sampling, rng: &mut u64) -> Result<i32> {
        let mut t = 0;
        check("sample", |e, n| {
            // SAFETY: live handle; rng and t writable.
            unsafe {
                sys::ds4_bridge_session_sample(self.raw(), s.temperature, s.top_k, s.top_p, s.min_p, rng, &mut t, e, n)
            }
        })?;
        Ok(t)
    }

    /// The last position's logits.
    pub fn logits(&self) -> Result<Vec<f32>> {
        // SAFETY: the session's model outlives it ('m), so its handle is live.
        let v = unsafe { sys::ds4_bridge_model_vocab_size(self.model_raw()) };
        let mut out = vec![0f32; v.max(0) as usize];
        check("logits", |e, n| {
            // SAFETY: out holds v floats.
            unsafe { sys::ds4_bridge_session_logits(self.raw(), out.as_mut_ptr(), out.len() as i32, e, n) }
        })?;
        Ok(out)
    }

    fn model_raw(&self) -> *mut sys::ds4_bridge_model {
        self.model
    }

    /// Top-n (token, logprob) of the last position.
    pub fn top_logprobs(&self, n: i32) -> Result<Vec<(i32, f32)>> {
        let mut ids = vec![0i32; n.max(0) as usize];
        let mut lp = vec![0f32; n.max(0) as usize];
        let mut got = 0;
        check("top logprobs", |e, en| {
            // SAFETY: ids and lp hold n entries each.
            unsafe {
                sys::ds4_bridge_session_top_logprobs(self.raw(), n, ids.as_mut_ptr(), lp.as_mut_ptr(), &mut got, e, en)
            }
        })?;
        Ok(ids.into_iter().zip(lp).take(got as usize).collect())
    }

    pub fn pos(&self) -> i32 {
        // SAFETY: live handle.
        unsafe { sys::ds4_bridge_session_pos(self.raw()) }
    }

    pub fn ctx(&self) -> i32 {
        // SAFETY: live handle.
        unsafe { sys::ds4_bridge_session_ctx(self.raw()) }
    }

    /// Tokens per prefill chunk: progress callbacks come at multiples of it.
    pub fn prefill_cap(&self) -> i32 {
        // SAFETY: live handle.
        unsafe { sys::ds4_bridge_session_prefill_cap(self.raw()) }
    }

    /// Bumped whenever the session's history is cut or lost (rewind, invalidate, failure).
    pub fn generation(&self) -> u64 {
        // SAFETY: live handle.
        unsafe { sys::ds4_bridge_session_generation(self.raw()) }
    }

    /// Drops positions >= pos.
    pub fn rewind(&mut self, pos: i32) -> Result<()> {
        check("rewind", |e, n| {
            // SAFETY: live handle.
            unsafe { sys::ds4_bridge_session_rewind(self.raw(), pos, e, n) }
        })
    }

    /// Drops the whole state.
    pub fn invalidate(&mut self) -> Result<()> {
        check("invalidate", |e, n| {
            // SAFETY: live handle.
            unsafe { sys::ds4_bridge_session_invalidate(self.raw(), e, n) }
        })
    }

    /// The payload (docs/ARCHITECTURE.md §4) in memory.
    pub fn save_payload_mem(&self) -> Result<Vec<u8>> {
        save_mem(self.raw())
    }

    pub fn save_payload(&self, path: impl AsRef<Path>) -> Result<()> {
        let p = c_string(path.as_ref())?;
        check("save payload", |e, n| {
            // SAFETY: live handle; p NUL-terminated.
            unsafe { sys::ds4_bridge_session_save_payload(self.raw(), p.as_ptr(), e, n) }
        })
    }

    pub fn load_payload_mem(&mut self, data: &[u8]) -> Result<()> {
        check("load payload", |e, n| {
            // SAFETY: data borrowed for the call.
            unsafe { sys::ds4_bridge_session_load_payload_mem(self.raw(), data.as_ptr(), data.len(), e, n) }
        })
    }

    pub fn load_payload(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let p = c_string(path.as_ref())?;
        check("load payload", |e, n| {
            // SAFETY: live handle; p NUL-terminated.
            unsafe { sys::ds4_bridge_session_load_payload(self.raw(), p.as_ptr(), e, n) }
        })
    }

    /// Loads the payload stored in bytes [offset, offset + length) of `path`. The host checks
    /// the range (overflow, inside the file) and the payload prefix (header, tokens, CRC,
    /// exact length, this model's fingerprint) before the engine is called, so a rejected
    /// range never reaches it; the engine then checks the tail.
    pub fn load_payload_range(&mut self, path: impl AsRef<Path>, offset: u64, length: u64) -> Result<()> {
        let path = path.as_ref();
        let (h, _) = payload::read_file_prefix(path, offset, length)?;
        // SAFETY: the model outlives the session ('m).
        let fp = unsafe { sys::ds4_bridge_model_fingerprint(self.model_raw()) };
        if h.fingerprint != fp {
            return Err(Error::new(format!(
                "payload range of {}: saved with another model (fingerprint {:016x}, this model {:016x})",
                path.display(),
                h.fingerprint,
                fp
            )));
        }
        if h.n_tokens as i64 > self.ctx() as i64 {
            return Err(Error::new(format!(
                "payload range of {}: {} tokens do not fit the session context of {}",
                path.display(),
                h.n_tokens,
                self.ctx()
            )));
        }
        let p = c_string(path)?;
        check("load payload range", |e, n| {
            // SAFETY: live handle; p NUL-terminated.
            unsafe { sys::ds4_bridge_session_load_payload_range(self.raw(), p.as_ptr(), offset, length, e, n) }
        })
    }

    /// The session's raw handle, for calls ds4-core does not wrap.
    pub fn as_raw(&self) -> *mut sys::ds4_bridge_session {
        self.raw()
    }
}

impl<'m> Drop for Session<'m> {
    fn drop(&mut self) {
        // SAFETY: the handle came from a successful session_create and is freed only here;
        // the borrow of the model guarantees the model is still open.
        unsafe { sys::ds4_bridge_session_free(self.raw.as_ptr()) }
    }
}
