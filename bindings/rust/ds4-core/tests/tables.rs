//! The host's tables handed to the open: a tensor directory and a bind plan. With tables that
//! describe the file the logits are bit-identical to an open without them; the engine checks
//! and reports plans slot by slot, and rejects tables that do not fit the files.
mod common;
use common::*;
use ds4_core::{HostTables, Model, NativeGguf, OpenOptions, TensorInventory};

fn logits(m: &Model, p: &[i32]) -> Vec<u32> {
    let mut s = m.session(128).unwrap();
    s.sync(p).unwrap();
    s.eval(p[1]).unwrap();
    bits(&s.logits().unwrap())
}

fn open_with(t: &HostTables) -> ds4_core::Result<Model> {
    OpenOptions::new(model_path()).threads(THREADS).host_tables(t).open()
}

#[test]
fn host_tables_give_bit_identical_logits() {
    let plain = open();
    let p = prompt(&plain, "with open(filename, 'rb') as f:\n    data = f.read()\n");
    let inv = TensorInventory::open(model_path()).unwrap();
    let g = NativeGguf::open(model_path()).unwrap();
    let required = g.required_tensors().unwrap();
    assert!(required.iter().any(|n| n == "token_embd.weight") && required.iter().any(|n| n == "output.weight"));
    assert!(required.len() <= inv.tensors.len());

    let tables = HostTables::new(&inv, &required).unwrap();
    tables.check(None).unwrap();
    tables.check(Some(&g)).unwrap();
    assert!(tables.identity().unwrap().iter().all(|&x| x == 1));
    let m = open_with(&tables).unwrap();
    // The tables are the open's only: drop them before the model runs (ASan would see any
    // pointer the engine kept).
    drop(tables);
    drop(inv);
    assert_eq!(m.fingerprint(), plain.fingerprint());
    assert_eq!(logits(&m, &p), logits(&plain, &p));

    // The plan alone, over the engine's own parse of the tensor table.
    let inv = TensorInventory::open(model_path()).unwrap();
    let plan_only = HostTables::new(&inv, &required).unwrap().plan_only();
    let m2 = open_with(&plan_only).unwrap();
    assert_eq!(logits(&m2, &p), logits(&plain, &p));
}

#[test]
fn the_plan_is_what_the_engine_binds() {
    let plain = open();
    let p = prompt(&plain, "import re\n");
    let inv = TensorInventory::open(model_path()).unwrap();
    let g = NativeGguf::open(model_path()).unwrap();
    let required = g.required_tensors().unwrap();
    let mut slots: Vec<i32> = required.iter().map(|n| inv.slot(n).unwrap() as i32).collect();
    // Swap two tensors of the same shape and type: the plan aliases them, the engine reports
    // it, binds what the plan says, and computes something else.
    let a = required.iter().position(|n| n == "blk.0.attn_norm.weight").unwrap();
    let b = required.iter().position(|n| n == "blk.0.ffn_norm.weight").unwrap();
    slots.swap(a, b);
    let swapped = HostTables::with_plan(&inv.tensors, &inv.data_offsets, &required, &slots).unwrap();
    swapped.check(Some(&g)).unwrap();
    let id = swapped.identity().unwrap();
    assert_eq!((id[a], id[b]), (0, 0));
    assert_eq!(id.iter().filter(|&&x| x == 1).count(), required.len() - 2);
    let m = open_with(&swapped).unwrap();
    assert_ne!(logits(&m, &p), logits(&plain, &p));
}

#[test]
fn bad_tables_are_rejected_with_the_reason() {
    let inv = TensorInventory::open(model_path()).unwrap();
    let g = NativeGguf::open(model_path()).unwrap();
    let required = g.required_tensors().unwrap();
    let slots: Vec<i32> = required.iter().map(|n| inv.slot(n).unwrap() as i32).collect();

    // A plan without a tensor the engine binds.
    let missing = HostTables::with_plan(&inv.tensors, &inv.data_offsets, &required[1..], &slots[1..]).unwrap();
    missing.check(None).unwrap(); // well-formed on its own...
    let e = missing.check(Some(&g)).err().unwrap(); // ...but not enough for this model
    assert!(e.message().contains(&required[0]), "{}", e);
    let e = open_with(&missing).err().unwrap();
    assert!(e.message().contains(&format!("no entry for tensor {}", required[0])), "{}", e);

    // A slot outside the inventory.
    let mut out_of_range = slots.clone();
    out_of_range[3] = inv.tensors.len() as i32;
    let t = HostTables::with_plan(&inv.tensors, &inv.data_offsets, &required, &out_of_range).unwrap();
    assert!(t.check(None).err().unwrap().message().contains("slot"));
    assert_eq!(t.identity().unwrap()[3], -1);
    assert!(open_with(&t).is_err());

    // A shape the binder does not accept (a vector where a matrix belongs).
    let mut wrong_shape = slots.clone();
    let emb = required.iter().position(|n| n == "token_embd.weight").unwrap();
    wrong_shape[emb] = inv.slot("output_norm.weight").unwrap() as i32;
    let t = HostTables::with_plan(&inv.tensors, &inv.data_offsets, &required, &wrong_shape).unwrap();
    let e = t.check(Some(&g)).err().unwrap();
    assert!(e.message().contains("shape"), "{}", e);
    assert!(open_with(&t).is_err());

    // Directory entries that do not fit the file: a size its type and shape do not make,
    // data beyond the end, a wrong data section offset, a missing tensor.
    let mut bad = inv.tensors.clone();
    bad[0].nbytes += 1;
    let e = open_with(&HostTables::with_plan(&bad, &inv.data_offsets, &required, &slots).unwrap()).err().unwrap();
    assert!(e.message().contains("bytes"), "{}", e);
    let mut bad = inv.tensors.clone();
    let last = bad.len() - 1;
    bad[last].offset += 1 << 40;
    let e = open_with(&HostTables::with_plan(&bad, &inv.data_offsets, &required, &slots).unwrap()).err().unwrap();
    assert!(e.message().contains("outside the file"), "{}", e);
    let e = open_with(&HostTables::with_plan(&inv.tensors, &[inv.data_offsets[0] + 7], &required, &slots).unwrap())
        .err()
        .unwrap();
    assert!(e.message().contains("alignment"), "{}", e);
    let e = open_with(&HostTables::with_plan(&inv.tensors[1..], &inv.data_offsets, &[], &[]).unwrap()).err().unwrap();
    assert!(e.message().contains("header says"), "{}", e);
}
