//! Raw declarations of ds4's C ABI, written by hand from `bridge/ds4_bridge.h` (no bindgen,
//! no engine types). Every item mirrors the header one to one; `tests/layout.rs` checks each
//! struct's size and field offsets against the C compiler's, so a header change that is not
//! mirrored here fails the tests.
//!
//! The contract (docs/ARCHITECTURE.md §3): handles are opaque, fallible calls return
//! `c_int` 0 on success with a message in the caller's `err` buffer, each open/create has one
//! free, borrowed arrays are length-delimited. `ds4-core` is the safe layer over this.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

/// Opaque model handle.
#[repr(C)]
pub struct ds4_bridge_model {
    _private: [u8; 0],
}
/// Opaque session handle.
#[repr(C)]
pub struct ds4_bridge_session {
    _private: [u8; 0],
}
/// Opaque batch handle (one forward step over several sessions).
#[repr(C)]
pub struct ds4_bridge_batch {
    _private: [u8; 0],
}
/// Opaque GGUF identification handle.
#[repr(C)]
pub struct ds4_bridge_gguf {
    _private: [u8; 0],
}

pub type ds4_bridge_prefill_fn = Option<unsafe extern "C" fn(ud: *mut c_void, current: i32, total: i32)>;
pub type ds4_bridge_load_fn = Option<unsafe extern "C" fn(ud: *mut c_void, done_bytes: u64, total_bytes: u64)>;

pub const DS4_BRIDGE_BACKEND_CUDA: i32 = 0;
pub const DS4_BRIDGE_BACKEND_CPU: i32 = 2;
pub const DS4_BRIDGE_BACKEND_AUTO: i32 = 3;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_model_open_options {
    pub model_path: *const c_char,
    pub mtp_path: *const c_char,
    pub backend: i32,
    pub n_threads: i32,
    pub defer_boot_prewarm: i32,
    pub ssd_streaming: i32,
    pub ssd_streaming_cold: i32,
    pub ssd_streaming_cache_experts: u32,
    pub ssd_streaming_cache_bytes: u64,
    pub mtp_draft_tokens: i32,
    pub tensor_directory: *const ds4_bridge_tensor_directory,
    pub bind_plan: *const ds4_bridge_bind_plan,
    pub drafter_path: *const c_char,
    pub draft_max: i32,
    pub ssd_streaming_store_dir: *const c_char,
    pub drafter_import: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_model_info_t {
    pub family: [c_char; 32],
    pub name: [c_char; 64],
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

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_memory_t {
    pub weights_bytes: u64,
    pub cache_bytes: u64,
    pub scratch_bytes: u64,
    pub device_free: u64,
    pub device_total: u64,
    pub device_weights_bytes: u64,
    pub backend: [c_char; 8],
    pub device: [c_char; 64],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_memory_ex_t {
    pub base: ds4_bridge_memory_t,
    pub drafter_weights_bytes: u64,
    pub drafter_mapped_bytes: u64,
    pub shared_bytes: u64,
    pub private_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_drafter_device_t {
    pub on_device: i32,
    pub export_fd: i32,
    pub imported: i32,
    pub read_only: i32,
    pub bytes: u64,
    pub granularity: u64,
    pub layout_hash: u64,
    pub uuid: [u8; 16],
    pub why: [c_char; 256],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_chat_msg {
    pub role: *const c_char,
    pub content: *const c_char,
    pub content_len: usize,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_spec_counters_t {
    pub trials: u64,
    pub drafted: u64,
    pub accepted: u64,
    pub fallbacks: u64,
    pub committed: u64,
    pub draft_max: i32,
    pub draft_width: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_expert_stats_t {
    pub streaming: i32,
    pub acquired: u64,
    pub misses: u64,
    pub late: u64,
    pub prefetched: u64,
    pub prefetch_used: u64,
    pub bytes_read: u64,
    pub store_reads: u64,
    pub store_corrupt: u64,
    pub demand_read_ns: u64,
    pub prefetch_read_ns: u64,
    pub wait_ns: u64,
    pub io_busy_ns: u64,
    pub resident: u64,
    pub capacity: u64,
    pub capacity_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_expert_stats_ex_t {
    pub base: ds4_bridge_expert_stats_t,
    pub tiers: i32,
    pub host_misses: u64,
    pub host_bytes_read: u64,
    pub host_capacity_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_batch_stats_t {
    pub steps: u64,
    pub rows: u64,
    pub sessions: u64,
    pub failed: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_spec_row {
    pub session: *mut ds4_bridge_session,
    pub pending: i32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub rng: *mut u64,
    pub max_new: i32,
    pub tokens: *mut i32,
    pub argmax: *mut i32,
    pub cap: i32,
    pub width: i32,
    pub accepted: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_gguf_info_t {
    pub family: [c_char; 32],
    pub name: [c_char; 64],
    pub n_layer: i32,
    pub n_embd: i32,
    pub n_vocab: i32,
    pub n_head: i32,
    pub n_expert: i32,
    pub n_tensors: i32,
    pub split_count: i32,
    pub tensor_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_gguf_tensor_t {
    pub name: [c_char; 128],
    pub type_: [c_char; 16],
    pub n_dims: i32,
    pub ne: [i64; 4],
    pub split: i32,
    pub offset: u64,
    pub nbytes: u64,
}

// --- host-owned tables ---------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_host_tensor {
    pub name: *const c_char,
    pub type_: u32,
    pub n_dims: i32,
    pub ne: [i64; 4],
    pub split: i32,
    pub offset: u64,
    pub nbytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_tensor_directory {
    pub tensors: *const ds4_bridge_host_tensor,
    pub n_tensors: i32,
    pub n_splits: i32,
    pub split_data_offset: *const u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ds4_bridge_bind_plan {
    pub names: *const *const c_char,
    pub slots: *const i32,
    pub n: i32,
}

extern "C" {
    // --- models ---
    pub fn ds4_bridge_model_open_options_init(opt: *mut ds4_bridge_model_open_options);
    pub fn ds4_bridge_model_open(
        out: *mut *mut ds4_bridge_model,
        opt: *const ds4_bridge_model_open_options,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_model_boot_prewarm(m: *mut ds4_bridge_model, err: *mut c_char, errlen: usize) -> c_int;
    pub fn ds4_bridge_model_boot_prewarm_cb(
        m: *mut ds4_bridge_model,
        progress: ds4_bridge_load_fn,
        ud: *mut c_void,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_model_free(m: *mut ds4_bridge_model);
    pub fn ds4_bridge_drafter_shared(m: *mut ds4_bridge_model) -> c_int;
    pub fn ds4_bridge_drafter_info(
        m: *mut ds4_bridge_model,
        out: *mut ds4_bridge_model_info_t,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_drafter_device(
        m: *mut ds4_bridge_model,
        out: *mut ds4_bridge_drafter_device_t,
        out_size: usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_model_vocab_size(m: *mut ds4_bridge_model) -> i32;
    pub fn ds4_bridge_model_info(
        m: *mut ds4_bridge_model,
        out: *mut ds4_bridge_model_info_t,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_memory_stats(
        m: *mut ds4_bridge_model,
        out: *mut ds4_bridge_memory_t,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_memory_stats_ex(
        m: *mut ds4_bridge_model,
        out: *mut ds4_bridge_memory_ex_t,
        out_size: usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_expert_stats(
        m: *mut ds4_bridge_model,
        out: *mut ds4_bridge_expert_stats_t,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_expert_stats_ex(
        m: *mut ds4_bridge_model,
        out: *mut ds4_bridge_expert_stats_ex_t,
        out_size: usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;

    // --- sessions ---
    pub fn ds4_bridge_session_create(
        out: *mut *mut ds4_bridge_session,
        m: *mut ds4_bridge_model,
        ctx_size: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_session_free(s: *mut ds4_bridge_session);
    pub fn ds4_bridge_session_sync(
        s: *mut ds4_bridge_session,
        tokens: *const i32,
        n_tokens: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_session_sync_cb(
        s: *mut ds4_bridge_session,
        tokens: *const i32,
        n_tokens: c_int,
        progress: ds4_bridge_prefill_fn,
        ud: *mut c_void,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_eval(s: *mut ds4_bridge_session, token: i32, err: *mut c_char, errlen: usize) -> c_int;
    pub fn ds4_bridge_session_argmax(
        s: *mut ds4_bridge_session,
        token_out: *mut i32,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_session_sample(
        s: *mut ds4_bridge_session,
        temperature: f32,
        top_k: c_int,
        top_p: f32,
        min_p: f32,
        rng: *mut u64,
        token_out: *mut i32,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_sample_logits(
        logits: *const f32,
        n: c_int,
        temperature: f32,
        top_k: c_int,
        top_p: f32,
        min_p: f32,
        rng: *mut u64,
        token_out: *mut i32,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_session_logits(
        s: *mut ds4_bridge_session,
        out: *mut f32,
        cap: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_session_pos(s: *mut ds4_bridge_session) -> c_int;
    pub fn ds4_bridge_session_ctx(s: *mut ds4_bridge_session) -> c_int;
    pub fn ds4_bridge_session_rewind(s: *mut ds4_bridge_session, pos: c_int, err: *mut c_char, errlen: usize) -> c_int;
    pub fn ds4_bridge_session_invalidate(s: *mut ds4_bridge_session, err: *mut c_char, errlen: usize) -> c_int;
    pub fn ds4_bridge_session_generation(s: *mut ds4_bridge_session) -> u64;
    pub fn ds4_bridge_session_prefill_cap(s: *mut ds4_bridge_session) -> c_int;
    pub fn ds4_bridge_session_top_logprobs(
        s: *mut ds4_bridge_session,
        n: c_int,
        ids: *mut i32,
        logprobs: *mut f32,
        n_out: *mut c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;

    // --- batches ---
    pub fn ds4_bridge_batch_create(
        out: *mut *mut ds4_bridge_batch,
        m: *mut ds4_bridge_model,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_batch_free(b: *mut ds4_bridge_batch);
    pub fn ds4_bridge_batch_eval(
        b: *mut ds4_bridge_batch,
        sessions: *const *mut ds4_bridge_session,
        counts: *const i32,
        n_sessions: c_int,
        tokens: *const i32,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_batch_stats(
        b: *mut ds4_bridge_batch,
        out: *mut ds4_bridge_batch_stats_t,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_spec_trial(
        s: *mut ds4_bridge_session,
        pending: i32,
        temperature: f32,
        top_k: c_int,
        top_p: f32,
        min_p: f32,
        rng: *mut u64,
        max_new: c_int,
        tokens: *mut i32,
        argmax: *mut i32,
        cap: c_int,
        accepted_out: *mut c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_spec_commit(s: *mut ds4_bridge_session, n: c_int, err: *mut c_char, errlen: usize) -> c_int;
    pub fn ds4_bridge_batch_eval_spec(
        b: *mut ds4_bridge_batch,
        sessions: *const *mut ds4_bridge_session,
        counts: *const i32,
        n_sessions: c_int,
        tokens: *const i32,
        spec: *mut ds4_bridge_spec_row,
        n_spec: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_session_spec_reset(s: *mut ds4_bridge_session, err: *mut c_char, errlen: usize) -> c_int;
    pub fn ds4_bridge_spec_counters(
        m: *mut ds4_bridge_model,
        out: *mut ds4_bridge_spec_counters_t,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_session_spec_counters(
        s: *mut ds4_bridge_session,
        out: *mut ds4_bridge_spec_counters_t,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;

    // --- payloads ---
    pub fn ds4_bridge_session_save_payload(
        s: *mut ds4_bridge_session,
        path: *const c_char,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_session_load_payload(
        s: *mut ds4_bridge_session,
        path: *const c_char,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_session_load_payload_range(
        s: *mut ds4_bridge_session,
        path: *const c_char,
        offset: u64,
        length: u64,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_session_payload_size(
        s: *mut ds4_bridge_session,
        size_out: *mut u64,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_session_save_payload_mem(
        s: *mut ds4_bridge_session,
        buf: *mut u8,
        cap: usize,
        len_out: *mut usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_session_load_payload_mem(
        s: *mut ds4_bridge_session,
        data: *const u8,
        len: usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_model_fingerprint(m: *mut ds4_bridge_model) -> u64;

    // --- tokenizer ---
    pub fn ds4_bridge_tokenize_text(
        m: *mut ds4_bridge_model,
        text: *const c_char,
        text_len: usize,
        out: *mut i32,
        cap: c_int,
        n_out: *mut c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_tokenize_rendered_chat(
        m: *mut ds4_bridge_model,
        text: *const c_char,
        text_len: usize,
        out: *mut i32,
        cap: c_int,
        n_out: *mut c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_token_text(
        m: *mut ds4_bridge_model,
        token: i32,
        buf: *mut c_char,
        cap: usize,
        len_out: *mut usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_detokenize(
        m: *mut ds4_bridge_model,
        tokens: *const i32,
        n: c_int,
        buf: *mut c_char,
        cap: usize,
        len_out: *mut usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_render_chat(
        m: *mut ds4_bridge_model,
        msgs: *const ds4_bridge_chat_msg,
        n_msgs: c_int,
        add_generation_prompt: c_int,
        thinking: c_int,
        out: *mut i32,
        cap: c_int,
        n_out: *mut c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_token_eos(m: *mut ds4_bridge_model) -> i32;
    pub fn ds4_bridge_token_is_stop(m: *mut ds4_bridge_model, token: i32) -> c_int;
    pub fn ds4_bridge_model_has_chat_template(m: *mut ds4_bridge_model) -> c_int;
    pub fn ds4_bridge_token_is_special(m: *mut ds4_bridge_model, token: i32) -> c_int;

    // --- GGUF identification ---
    pub fn ds4_bridge_gguf_open(
        out: *mut *mut ds4_bridge_gguf,
        path: *const c_char,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_gguf_free(g: *mut ds4_bridge_gguf);
    pub fn ds4_bridge_gguf_info(
        g: *mut ds4_bridge_gguf,
        out: *mut ds4_bridge_gguf_info_t,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_gguf_tensor(
        g: *mut ds4_bridge_gguf,
        index: c_int,
        out: *mut ds4_bridge_gguf_tensor_t,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;

    // --- host-owned tables ---
    pub fn ds4_bridge_gguf_required_tensors(
        g: *mut ds4_bridge_gguf,
        buf: *mut c_char,
        cap: usize,
        len_out: *mut usize,
        n_out: *mut i32,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_bind_plan_check(
        g: *mut ds4_bridge_gguf,
        inventory: *const ds4_bridge_tensor_directory,
        plan: *const ds4_bridge_bind_plan,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_bind_plan_match(
        inventory: *const ds4_bridge_tensor_directory,
        plan: *const ds4_bridge_bind_plan,
        identity_out: *mut i32,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;

    // --- cache memory ---
    pub fn ds4_bridge_session_cache_bytes(
        s: *mut ds4_bridge_session,
        bytes_out: *mut u64,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_cache_bytes_for(
        m: *mut ds4_bridge_model,
        ctx_size: c_int,
        n_tokens: c_int,
        bytes_out: *mut u64,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ds4_bridge_drafter_cache_bytes_for(
        m: *mut ds4_bridge_model,
        ctx_size: c_int,
        n_tokens: c_int,
        bytes_out: *mut u64,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
}
