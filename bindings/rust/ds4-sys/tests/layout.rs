//! Every struct of ds4_bridge.h: size and field offsets here must equal the C compiler's, as
//! printed by the abi_layout program (DS4_ABI_LAYOUT; CMake builds it as ds4-rust-abi-layout).
//! Each line the C side prints must be checked here and the other way round, so a field added
//! to either side without the other fails.
use ds4_sys::*;
use std::collections::BTreeMap;
use std::mem::{size_of, MaybeUninit};

macro_rules! offset {
    ($t:ty, $f:ident) => {{
        let u = MaybeUninit::<$t>::uninit();
        let base = u.as_ptr();
        // SAFETY: addr_of! computes the field address without reading or referencing it.
        let field = unsafe { std::ptr::addr_of!((*base).$f) };
        field as usize - base as usize
    }};
}

macro_rules! layout {
    ($m:ident, $t:ident { $($f:ident $(= $cname:literal)?),* $(,)? }) => {{
        $m.insert(stringify!($t).to_string(), size_of::<$t>());
        $(
            #[allow(unused_mut, unused_assignments)]
            let mut cname = stringify!($f);
            $( cname = $cname; )?
            $m.insert(format!("{}.{}", stringify!($t), cname), offset!($t, $f));
        )*
    }};
}

fn rust_layout() -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    layout!(
        m,
        ds4_bridge_model_open_options {
            model_path,
            mtp_path,
            backend,
            n_threads,
            defer_boot_prewarm,
            ssd_streaming,
            ssd_streaming_cold,
            ssd_streaming_cache_experts,
            ssd_streaming_cache_bytes,
            mtp_draft_tokens,
            tensor_directory,
            bind_plan,
            drafter_path,
            draft_max,
            ssd_streaming_store_dir,
            drafter_import,
        }
    );
    layout!(
        m,
        ds4_bridge_model_info_t {
            family,
            name,
            n_layer,
            n_embd,
            n_vocab,
            n_head,
            head_dim,
            n_expert,
            n_expert_used,
            n_ctx_max,
            fingerprint,
        }
    );
    layout!(
        m,
        ds4_bridge_memory_t {
            weights_bytes,
            cache_bytes,
            scratch_bytes,
            device_free,
            device_total,
            device_weights_bytes,
            backend,
            device,
        }
    );
    layout!(
        m,
        ds4_bridge_memory_ex_t { base, drafter_weights_bytes, drafter_mapped_bytes, shared_bytes, private_bytes }
    );
    layout!(
        m,
        ds4_bridge_drafter_device_t { on_device, export_fd, imported, read_only, bytes, granularity, layout_hash, uuid, why }
    );
    layout!(m, ds4_bridge_chat_msg { role, content, content_len });
    layout!(
        m,
        ds4_bridge_expert_stats_t {
            streaming,
            acquired,
            misses,
            late,
            prefetched,
            prefetch_used,
            bytes_read,
            store_reads,
            store_corrupt,
            demand_read_ns,
            prefetch_read_ns,
            wait_ns,
            io_busy_ns,
            resident,
            capacity,
            capacity_bytes,
        }
    );
    layout!(m, ds4_bridge_expert_stats_ex_t { base, tiers, host_misses, host_bytes_read, host_capacity_bytes });
    layout!(m, ds4_bridge_batch_stats_t { steps, rows, sessions, failed });
    layout!(m, ds4_bridge_spec_counters_t { trials, drafted, accepted, fallbacks, committed, draft_max, draft_width });
    layout!(
        m,
        ds4_bridge_spec_row { session, pending, temperature, top_k, top_p, min_p, rng, max_new, tokens, argmax, cap, width, accepted }
    );
    layout!(
        m,
        ds4_bridge_gguf_info_t {
            family,
            name,
            n_layer,
            n_embd,
            n_vocab,
            n_head,
            n_expert,
            n_tensors,
            split_count,
            tensor_bytes,
        }
    );
    layout!(m, ds4_bridge_gguf_tensor_t { name, type_ = "type", n_dims, ne, split, offset, nbytes });
    layout!(m, ds4_bridge_host_tensor { name, type_ = "type", n_dims, ne, split, offset, nbytes });
    layout!(m, ds4_bridge_tensor_directory { tensors, n_tensors, n_splits, split_data_offset });
    layout!(m, ds4_bridge_bind_plan { names, slots, n });
    m
}

#[test]
fn struct_layout_matches_the_c_header() {
    let exe = std::env::var("DS4_ABI_LAYOUT")
        .expect("DS4_ABI_LAYOUT must name the abi_layout program (ctest sets it; see bindings/rust/README)");
    let out = std::process::Command::new(&exe).output().expect("running the abi_layout program");
    assert!(out.status.success(), "{} failed", exe);
    let mut c = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let mut it = line.split(' ');
        let (k, v) = (it.next().unwrap(), it.next().unwrap());
        c.insert(k.to_string(), v.parse::<usize>().unwrap());
    }
    let r = rust_layout();
    let mut diffs = Vec::new();
    for (k, v) in &c {
        match r.get(k) {
            Some(rv) if rv == v => {}
            Some(rv) => diffs.push(format!("{}: C {} Rust {}", k, v, rv)),
            None => diffs.push(format!("{}: in C ({}), not checked in Rust", k, v)),
        }
    }
    for k in r.keys() {
        if !c.contains_key(k) {
            diffs.push(format!("{}: in Rust, not printed by the C side", k));
        }
    }
    assert!(diffs.is_empty(), "ds4-sys does not mirror ds4_bridge.h:\n{}", diffs.join("\n"));
    assert!(c.len() > 60, "the C side printed only {} entries", c.len());
}

// Every function and struct the header declares is declared here and laid out by the C side:
// a header addition that is not mirrored fails (names only; the layouts are checked above).
#[test]
fn every_header_declaration_is_mirrored() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..");
    let header = std::fs::read_to_string(root.join("bridge/ds4_bridge.h")).unwrap();
    let sys = std::fs::read_to_string(root.join("bindings/rust/ds4-sys/src/lib.rs")).unwrap();
    let layout_c = std::fs::read_to_string(root.join("tests/rust/abi_layout.c")).unwrap();
    let ident = |s: &str| {
        s.chars()
            .rev()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect::<String>()
            .chars()
            .rev()
            .collect::<String>()
    };
    let mut missing = Vec::new();
    let mut n_fn = 0;
    for decl in header.split("DS4_BRIDGE_API").skip(2) {
        // skip(2): the text before the first use and the #define itself
        let name = ident(decl.split('(').next().unwrap().trim_end());
        n_fn += 1;
        if !sys.contains(&format!("pub fn {}(", name)) {
            missing.push(format!("function {}", name));
        }
    }
    let mut n_struct = 0;
    for part in header.split("\n}").skip(1) {
        // "} name;" closes a typedef'd struct
        let name = part.lines().next().unwrap_or("").trim().trim_end_matches(';').to_string();
        if !name.starts_with("ds4_bridge_") || name != ident(&name) {
            continue;
        }
        n_struct += 1;
        if !sys.contains(&format!("pub struct {} {{", name)) {
            missing.push(format!("struct {}", name));
        }
        if !layout_c.contains(&format!("S({});", name)) {
            missing.push(format!("struct {} in tests/rust/abi_layout.c", name));
        }
    }
    assert!(n_fn > 40 && n_struct >= 9, "parsed {} functions and {} structs from the header", n_fn, n_struct);
    assert!(missing.is_empty(), "ds4_bridge.h declares what ds4-sys does not:\n{}", missing.join("\n"));
}
