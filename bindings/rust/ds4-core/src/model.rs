//! Models, open options, the host tables handed to the open, and the engine's own GGUF
//! identification handle (used to compare the host's parse with the engine's).
use crate::error::{check, field_str, Error, Result};
use crate::gguf::{TensorEntry, TensorInventory};
use crate::session::Session;
use ds4_sys as sys;
use std::ffi::CString;
use std::os::raw::c_char;
use std::path::Path;
use std::ptr::{self, NonNull};

fn c_path(p: &Path) -> Result<CString> {
    CString::new(p.to_string_lossy().into_owned()).map_err(|_| Error::new("path contains a NUL byte"))
}

/// Which backend runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Cuda,
    Auto,
}

/// The host's tensor directory and bind plan in the ABI's form, built from a
/// [`TensorInventory`]. Borrowed by [`OpenOptions::host_tables`] for the open only.
pub struct HostTables {
    names: Vec<CString>,
    tensors: Vec<sys::ds4_bridge_host_tensor>,
    data_offsets: Vec<u64>,
    plan_names: Vec<CString>,
    plan_name_ptrs: Vec<*const c_char>,
    plan_slots: Vec<i32>,
    with_directory: bool,
}

impl HostTables {
    /// The inventory as a directory, and a plan binding each of `required` (the names the
    /// engine binds, [`NativeGguf::required_tensors`]) to the inventory entry of that name.
    pub fn new(inv: &TensorInventory, required: &[String]) -> Result<HostTables> {
        let mut slots = Vec::with_capacity(required.len());
        for r in required {
            let s = inv.slot(r).ok_or_else(|| Error::new(format!("the inventory has no tensor {}", r)))?;
            slots.push(s as i32);
        }
        HostTables::with_plan(&inv.tensors, &inv.data_offsets, required, &slots)
    }

    /// A directory of `tensors` and a plan binding `plan_names[i]` to slot `plan_slots[i]`
    /// as given (tests use it to build aliased or broken plans).
    pub fn with_plan(
        tensors: &[TensorEntry],
        data_offsets: &[u64],
        plan_names: &[String],
        plan_slots: &[i32],
    ) -> Result<HostTables> {
        if plan_names.len() != plan_slots.len() {
            return Err(Error::new("bind plan: names and slots differ in length"));
        }
        let names = tensors
            .iter()
            .map(|t| CString::new(t.name.clone()).map_err(|_| Error::new("tensor name contains a NUL byte")))
            .collect::<Result<Vec<_>>>()?;
        let mut raw = Vec::with_capacity(tensors.len());
        for (t, n) in tensors.iter().zip(&names) {
            let mut ne = [1i64; 4];
            ne[..t.ne.len()].copy_from_slice(&t.ne);
            raw.push(sys::ds4_bridge_host_tensor {
                name: n.as_ptr(),
                type_: t.type_id,
                n_dims: t.ne.len() as i32,
                ne,
                split: t.split,
                offset: t.offset,
                nbytes: t.nbytes,
            });
        }
        let plan_names = plan_names
            .iter()
            .map(|s| CString::new(s.clone()).map_err(|_| Error::new("tensor name contains a NUL byte")))
            .collect::<Result<Vec<_>>>()?;
        let plan_name_ptrs = plan_names.iter().map(|s| s.as_ptr()).collect();
        Ok(HostTables {
            names,
            tensors: raw,
            data_offsets: data_offsets.to_vec(),
            plan_names,
            plan_name_ptrs,
            plan_slots: plan_slots.to_vec(),
            with_directory: true,
        })
    }

    /// Hands only the bind plan to the open (its slots then index the file's own tensor
    /// table, which the engine parses itself).
    pub fn plan_only(mut self) -> HostTables {
        self.with_directory = false;
        self
    }

    // The raw views point into this value's vectors (CStrings are heap-allocated, so moving
    // the HostTables moves no name); they live as long as the borrow of self.
    fn directory(&self) -> sys::ds4_bridge_tensor_directory {
        let _ = &self.names; // keeps the names the tensors point at alive
        sys::ds4_bridge_tensor_directory {
            tensors: self.tensors.as_ptr(),
            n_tensors: self.tensors.len() as i32,
            n_splits: self.data_offsets.len() as i32,
            split_data_offset: self.data_offsets.as_ptr(),
        }
    }
    fn plan(&self) -> sys::ds4_bridge_bind_plan {
        let _ = &self.plan_names;
        sys::ds4_bridge_bind_plan {
            names: self.plan_name_ptrs.as_ptr(),
            slots: self.plan_slots.as_ptr(),
            n: self.plan_slots.len() as i32,
        }
    }

    /// The engine's check of the plan over this directory (`ds4_bridge_bind_plan_check`);
    /// with `g` also the binder's dry run against that model's metadata.
    pub fn check(&self, g: Option<&NativeGguf>) -> Result<()> {
        let (dir, plan) = (self.directory(), self.plan());
        let gp = g.map(|g| g.raw.as_ptr()).unwrap_or(ptr::null_mut());
        check("bind plan check", |e, n| {
            // SAFETY: dir and plan point into self, alive for the call; gp is a live handle or NULL.
            unsafe { sys::ds4_bridge_bind_plan_check(gp, &dir, &plan, e, n) }
        })
    }

    /// The engine's slot-by-slot identity report (`ds4_bridge_bind_plan_match`): 1 when the
    /// slot holds the tensor of that name, 0 when the plan aliases it, -1 out of range.
    pub fn identity(&self) -> Result<Vec<i32>> {
        let (dir, plan) = (self.directory(), self.plan());
        let mut out = vec![0i32; self.plan_slots.len()];
        check("bind plan match", |e, n| {
            // SAFETY: dir/plan point into self; out holds plan.n entries.
            unsafe { sys::ds4_bridge_bind_plan_match(&dir, &plan, out.as_mut_ptr(), e, n) }
        })?;
        Ok(out)
    }
}

/// How to open a model. `'t` is the borrow of the optional host tables.
pub struct OpenOptions<'t> {
    path: std::path::PathBuf,
    backend: Backend,
    n_threads: i32,
    defer_prewarm: bool,
    tables: Option<&'t HostTables>,
}

impl<'t> OpenOptions<'t> {
    pub fn new(path: impl AsRef<Path>) -> OpenOptions<'t> {
        OpenOptions {
            path: path.as_ref().to_path_buf(),
            backend: Backend::Cpu,
            n_threads: 0,
            defer_prewarm: false,
            tables: None,
        }
    }
    pub fn backend(mut self, b: Backend) -> Self {
        self.backend = b;
        self
    }
    /// 0 = all cores.
    pub fn threads(mut self, n: i32) -> Self {
        self.n_threads = n;
        self
    }
    pub fn defer_prewarm(mut self, yes: bool) -> Self {
        self.defer_prewarm = yes;
        self
    }
    /// Hands the host's tensor directory and bind plan to the open (borrowed for it only).
    pub fn host_tables(mut self, t: &'t HostTables) -> Self {
        self.tables = Some(t);
        self
    }
    pub fn open(self) -> Result<Model> {
        Model::open_with(self)
    }
}

/// What a model is (`ds4_bridge_model_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    pub family: String,
    pub name: String,
    pub n_layer: i32,
    pub n_embd: i32,
    pub n_vocab: i32,
    pub n_head: i32,
    pub head_dim: i32,
    pub n_expert: i32,
    pub n_expert_used: i32,
    pub n_ctx_max: i32,
    pub fingerprint: u64,
}

/// A loaded model. Its handle is freed exactly once, by Drop; sessions borrow it, so a model
/// cannot be dropped while one of its sessions lives.
pub struct Model {
    raw: NonNull<sys::ds4_bridge_model>,
}

// SAFETY: a model handle is not tied to the thread that opened it; the contract's limit
// (sessions of one model must not run concurrently) is kept by Model being !Sync: sessions
// borrow &Model, so they all live on the thread that holds the model.
unsafe impl Send for Model {}

impl Model {
    /// Opens with default options (CPU backend, all cores).
    pub fn open(path: impl AsRef<Path>) -> Result<Model> {
        OpenOptions::new(path).open()
    }

    fn open_with(o: OpenOptions<'_>) -> Result<Model> {
        let path = c_path(&o.path)?;
        let mut opt = std::mem::MaybeUninit::<sys::ds4_bridge_model_open_options>::zeroed();
        // SAFETY: the init function fills every field of the struct it is given.
        unsafe { sys::ds4_bridge_model_open_options_init(opt.as_mut_ptr()) };
        // SAFETY: zeroed and then initialised by the bridge: every field holds a valid value.
        let mut opt = unsafe { opt.assume_init() };
        opt.model_path = path.as_ptr();
        opt.backend = match o.backend {
            Backend::Cpu => sys::DS4_BRIDGE_BACKEND_CPU,
            Backend::Cuda => sys::DS4_BRIDGE_BACKEND_CUDA,
            Backend::Auto => sys::DS4_BRIDGE_BACKEND_AUTO,
        };
        opt.n_threads = o.n_threads;
        opt.defer_boot_prewarm = o.defer_prewarm as i32;
        let dir;
        let plan;
        if let Some(t) = o.tables {
            dir = t.directory();
            plan = t.plan();
            if t.with_directory {
                opt.tensor_directory = &dir;
            }
            opt.bind_plan = &plan;
        }
        let mut out = ptr::null_mut();
        check("open model", |e, n| {
            // SAFETY: opt and everything it points to (path, tables) outlive the call.
            unsafe { sys::ds4_bridge_model_open(&mut out, &opt, e, n) }
        })?;
        NonNull::new(out).map(|raw| Model { raw }).ok_or_else(|| Error::new("open model: no handle returned"))
    }

    pub(crate) fn raw(&self) -> *mut sys::ds4_bridge_model {
        self.raw.as_ptr()
    }

    /// A new session with room for `ctx` tokens; it borrows the model.
    pub fn session(&self, ctx: i32) -> Result<Session<'_>> {
        let mut out = ptr::null_mut();
        check("create session", |e, n| {
            // SAFETY: the model handle is live while &self is.
            unsafe { sys::ds4_bridge_session_create(&mut out, self.raw(), ctx, e, n) }
        })?;
        let raw = NonNull::new(out).ok_or_else(|| Error::new("create session: no handle returned"))?;
        Ok(Session::from_raw(raw, self))
    }

    /// A batch for stepping several of this model's sessions at once.
    pub fn batch(&self) -> Result<crate::Batch<'_>> {
        crate::Batch::new(self)
    }

    pub fn info(&self) -> Result<ModelInfo> {
        let mut i = std::mem::MaybeUninit::<sys::ds4_bridge_model_info_t>::zeroed();
        check("model info", |e, n| {
            // SAFETY: live handle; i is a writable struct of the ABI's layout.
            unsafe { sys::ds4_bridge_model_info(self.raw(), i.as_mut_ptr(), e, n) }
        })?;
        // SAFETY: zeroed plain-data struct, filled by the bridge.
        let i = unsafe { i.assume_init() };
        Ok(ModelInfo {
            family: field_str(&i.family),
            name: field_str(&i.name),
            n_layer: i.n_layer,
            n_embd: i.n_embd,
            n_vocab: i.n_vocab,
            n_head: i.n_head,
            head_dim: i.head_dim,
            n_expert: i.n_expert,
            n_expert_used: i.n_expert_used,
            n_ctx_max: i.n_ctx_max,
            fingerprint: i.fingerprint,
        })
    }

    pub fn vocab_size(&self) -> i32 {
        // SAFETY: live handle.
        unsafe { sys::ds4_bridge_model_vocab_size(self.raw()) }
    }

    pub fn fingerprint(&self) -> u64 {
        // SAFETY: live handle.
        unsafe { sys::ds4_bridge_model_fingerprint(self.raw()) }
    }

    /// The engine's tokenizer on plain text (control tokens never match).
    pub fn tokenize(&self, text: &[u8]) -> Result<Vec<i32>> {
        self.tokenize_with(text, false)
    }

    /// The engine's tokenizer on rendered chat text (control tokens match).
    pub fn tokenize_special(&self, text: &[u8]) -> Result<Vec<i32>> {
        self.tokenize_with(text, true)
    }

    fn tokenize_with(&self, text: &[u8], special: bool) -> Result<Vec<i32>> {
        let mut out = vec![0i32; text.len() + 8];
        let mut n = 0;
        let f = if special { sys::ds4_bridge_tokenize_rendered_chat } else { sys::ds4_bridge_tokenize_text };
        check("tokenize", |e, en| {
            // SAFETY: text is text.len() readable bytes; out holds out.len() ids (tokens never
            // outnumber bytes, plus slack).
            unsafe {
                f(
                    self.raw(),
                    text.as_ptr() as *const c_char,
                    text.len(),
                    out.as_mut_ptr(),
                    out.len() as i32,
                    &mut n,
                    e,
                    en,
                )
            }
        })?;
        out.truncate(n as usize);
        Ok(out)
    }

    /// The engine's decoding of ids to bytes.
    pub fn detokenize(&self, ids: &[i32]) -> Result<Vec<u8>> {
        let mut len = 0usize;
        let mut buf = vec![0u8; 64];
        for _ in 0..2 {
            let r = check("detokenize", |e, n| {
                // SAFETY: ids is ids.len() ids; buf is buf.len() writable bytes.
                unsafe {
                    sys::ds4_bridge_detokenize(
                        self.raw(),
                        ids.as_ptr(),
                        ids.len() as i32,
                        buf.as_mut_ptr() as *mut c_char,
                        buf.len(),
                        &mut len,
                        e,
                        n,
                    )
                }
            });
            if r.is_ok() {
                buf.truncate(len);
                return Ok(buf);
            }
            if len + 1 <= buf.len() {
                return Err(r.unwrap_err());
            }
            buf.resize(len + 1, 0);
        }
        Err(Error::new("detokenize: buffer size changed between calls"))
    }

    pub fn eos(&self) -> i32 {
        // SAFETY: live handle.
        unsafe { sys::ds4_bridge_token_eos(self.raw()) }
    }

    pub fn is_stop(&self, token: i32) -> bool {
        // SAFETY: live handle.
        unsafe { sys::ds4_bridge_token_is_stop(self.raw(), token) == 1 }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: the handle came from a successful open and is freed only here.
        unsafe { sys::ds4_bridge_model_free(self.raw.as_ptr()) }
    }
}

/// The engine's own identification of a GGUF (`ds4_bridge_gguf_*`): what the host's parse
/// is checked against, and the source of the names the engine binds.
pub struct NativeGguf {
    raw: NonNull<sys::ds4_bridge_gguf>,
}

impl NativeGguf {
    pub fn open(path: impl AsRef<Path>) -> Result<NativeGguf> {
        let p = c_path(path.as_ref())?;
        let mut out = ptr::null_mut();
        check("gguf open", |e, n| {
            // SAFETY: p is NUL-terminated and outlives the call.
            unsafe { sys::ds4_bridge_gguf_open(&mut out, p.as_ptr(), e, n) }
        })?;
        NonNull::new(out).map(|raw| NativeGguf { raw }).ok_or_else(|| Error::new("gguf open: no handle"))
    }

    pub fn identity(&self) -> Result<crate::gguf::GgufIdentity> {
        let mut i = std::mem::MaybeUninit::<sys::ds4_bridge_gguf_info_t>::zeroed();
        check("gguf info", |e, n| {
            // SAFETY: live handle; i is a writable struct of the ABI's layout.
            unsafe { sys::ds4_bridge_gguf_info(self.raw.as_ptr(), i.as_mut_ptr(), e, n) }
        })?;
        // SAFETY: zeroed plain-data struct, filled by the bridge.
        let i = unsafe { i.assume_init() };
        Ok(crate::gguf::GgufIdentity {
            family: field_str(&i.family),
            name: field_str(&i.name),
            n_layer: i.n_layer,
            n_embd: i.n_embd,
            n_vocab: i.n_vocab,
            n_head: i.n_head,
            n_expert: i.n_expert,
            n_tensors: i.n_tensors,
            split_count: i.split_count,
            tensor_bytes: i.tensor_bytes,
        })
    }

    /// Tensor `index` as the engine parsed it: (entry, type name).
    pub fn tensor(&self, index: i32) -> Result<(TensorEntry, String)> {
        let mut t = std::mem::MaybeUninit::<sys::ds4_bridge_gguf_tensor_t>::zeroed();
        check("gguf tensor", |e, n| {
            // SAFETY: live handle; t is writable.
            unsafe { sys::ds4_bridge_gguf_tensor(self.raw.as_ptr(), index, t.as_mut_ptr(), e, n) }
        })?;
        // SAFETY: zeroed plain-data struct, filled by the bridge.
        let t = unsafe { t.assume_init() };
        let ty = field_str(&t.type_);
        let type_id = (0u32..31).find(|&id| crate::gguf::type_name(id) == ty).unwrap_or(u32::MAX);
        Ok((
            TensorEntry {
                name: field_str(&t.name),
                type_id,
                ne: t.ne[..t.n_dims.clamp(0, 4) as usize].to_vec(),
                split: t.split,
                offset: t.offset,
                nbytes: t.nbytes,
            },
            ty,
        ))
    }

    /// The tensor names the engine binds for this model, in binding order.
    pub fn required_tensors(&self) -> Result<Vec<String>> {
        let (mut len, mut count) = (0usize, 0i32);
        let _ = check("required tensors", |e, n| {
            // SAFETY: a zero-capacity query: nothing is written to the NULL buffer.
            unsafe {
                sys::ds4_bridge_gguf_required_tensors(self.raw.as_ptr(), ptr::null_mut(), 0, &mut len, &mut count, e, n)
            }
        });
        let mut buf = vec![0u8; len];
        check("required tensors", |e, n| {
            // SAFETY: buf holds len writable bytes.
            unsafe {
                sys::ds4_bridge_gguf_required_tensors(
                    self.raw.as_ptr(),
                    buf.as_mut_ptr() as *mut c_char,
                    buf.len(),
                    &mut len,
                    &mut count,
                    e,
                    n,
                )
            }
        })?;
        let names: Vec<String> =
            buf.split(|&b| b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect();
        if names.len() != count as usize {
            return Err(Error::new("required tensors: count and names disagree"));
        }
        Ok(names)
    }
}

impl Drop for NativeGguf {
    fn drop(&mut self) {
        // SAFETY: from a successful gguf_open, freed only here.
        unsafe { sys::ds4_bridge_gguf_free(self.raw.as_ptr()) }
    }
}
