//! The host's GGUF parse against the engine's on the same files: identification, the tensor
//! inventory, and split sets (shard remapping) written here from the trained model.
mod common;
use common::*;
use ds4_core::gguf::{parse_split_path, split_path};
use ds4_core::{identify_gguf, HostTables, NativeGguf, OpenOptions, TensorInventory};
use std::path::Path;

fn native_inventory(path: &Path) -> Vec<ds4_core::TensorEntry> {
    let g = NativeGguf::open(path).unwrap();
    let n = g.identity().unwrap().n_tensors;
    (0..n).map(|i| g.tensor(i).unwrap().0).collect()
}

#[test]
fn identification_and_inventory_match_the_engine() {
    let p = model_path();
    let host = identify_gguf(&p).unwrap();
    let native = NativeGguf::open(&p).unwrap().identity().unwrap();
    assert_eq!(host, native);
    assert_eq!(host.family, "deepseek4");
    assert_eq!(host.split_count, 1);

    let inv = TensorInventory::open(&p).unwrap();
    let nat = native_inventory(&p);
    assert_eq!(inv.tensors.len(), nat.len());
    for (h, n) in inv.tensors.iter().zip(&nat) {
        assert_eq!(h, n, "tensor {}", h.name);
    }
    assert_eq!(inv.slot("token_embd.weight").map(|s| &inv.tensors[s].name[..]), Some("token_embd.weight"));
    assert_eq!(inv.slot("no.such.tensor"), None);
}

#[test]
fn split_names() {
    assert_eq!(split_path("/a/m", 2, 3), "/a/m-00002-of-00003.gguf");
    assert_eq!(parse_split_path("/a/m-00002-of-00003.gguf"), Some(("/a/m".to_string(), 2, 3)));
    assert_eq!(parse_split_path("/a/m-00004-of-00003.gguf"), None);
    assert_eq!(parse_split_path("/a/m-00000-of-00003.gguf"), None);
    assert_eq!(parse_split_path("/a/m-0000x-of-00003.gguf"), None);
    assert_eq!(parse_split_path("/a/m.gguf"), None);
}

#[test]
fn split_sets_are_remapped_like_the_engine_and_run_identically() {
    let dir = TempDir::new("split");
    let paths = write_split_set(&model_path(), &dir.file("m"), 3);
    // Any shard names the set.
    for p in &paths {
        let host = identify_gguf(p).unwrap();
        assert_eq!(host, NativeGguf::open(p).unwrap().identity().unwrap());
        assert_eq!(host.split_count, 3);
    }
    let inv = TensorInventory::open(&paths[1]).unwrap();
    assert_eq!(inv.tensors, native_inventory(&paths[0]));
    assert_eq!(inv.data_offsets.len(), 3);
    assert!((0..3).all(|k| inv.tensors.iter().any(|t| t.split == k)), "every shard holds tensors");
    let whole = TensorInventory::open(model_path()).unwrap();
    let names: Vec<_> = inv.tensors.iter().map(|t| &t.name).collect();
    assert_eq!(names, whole.tensors.iter().map(|t| &t.name).collect::<Vec<_>>());

    // The split set computes exactly what the single file does, opened by the engine alone
    // and with the host's tables.
    let m = open();
    let p = prompt(&m, "for name in sorted(os.listdir(path)):\n");
    let logits = |model: &ds4_core::Model| {
        let mut s = model.session(64).unwrap();
        s.sync(&p).unwrap();
        bits(&s.logits().unwrap())
    };
    let want = logits(&m);
    let split_native = OpenOptions::new(&paths[0]).threads(THREADS).open().unwrap();
    assert_eq!(logits(&split_native), want);
    let required = NativeGguf::open(&paths[0]).unwrap().required_tensors().unwrap();
    let tables = HostTables::new(&inv, &required).unwrap();
    let split_host = OpenOptions::new(&paths[2]).threads(THREADS).host_tables(&tables).open().unwrap();
    drop(tables);
    assert_eq!(logits(&split_host), want);

    // A missing shard fails both parses.
    std::fs::remove_file(&paths[2]).unwrap();
    let e = TensorInventory::open(&paths[0]).err().unwrap();
    assert!(e.message().contains("00003-of-00003"), "{}", e);
    assert!(NativeGguf::open(&paths[0]).is_err());
}
