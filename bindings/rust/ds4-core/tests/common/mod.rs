//! Shared by the integration tests: the trained model, temporary directories.
#![allow(dead_code)]
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The trained default model (DS4_TEST_MODEL overrides).
pub fn model_path() -> PathBuf {
    if let Ok(p) = std::env::var("DS4_TEST_MODEL") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../models/ds4-pystd-q8_0.gguf")
}

/// Threads for test models: few, the machine is shared.
pub const THREADS: i32 = 2;

pub fn open() -> ds4_core::Model {
    ds4_core::OpenOptions::new(model_path()).threads(THREADS).open().expect("open the trained model")
}

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let base = std::env::var("DS4_TEST_TMP").map(PathBuf::from).unwrap_or_else(|_| std::env::temp_dir());
        let p = base.join(format!("ds4-rs-{}-{}-{}", tag, std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A Python-looking prompt tokenized by the model.
pub fn prompt(m: &ds4_core::Model, text: &str) -> Vec<i32> {
    let mut t = vec![ds4_core::Vocab::open(model_path()).unwrap().bos()];
    t.extend(m.tokenize(text.as_bytes()).unwrap());
    t
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Writes `src` as a split set of `n` files `prefix-0000K-of-0000N.gguf` the way gguf-split
/// does (metadata in the first, split.no/count/tensors.count in each, tensors spread in
/// order); returns the paths.
pub fn write_split_set(src: &std::path::Path, prefix: &std::path::Path, n: usize) -> Vec<PathBuf> {
    use ds4_core::gguf::{split_path, GgufFile};
    use std::io::{Read, Seek, SeekFrom, Write};
    let g = GgufFile::open(src).unwrap();
    let mut raw = std::fs::File::open(src).unwrap();
    let read = |f: &mut std::fs::File, at: u64, len: u64| {
        let mut b = vec![0u8; len as usize];
        f.seek(SeekFrom::Start(at)).unwrap();
        f.read_exact(&mut b).unwrap();
        b
    };
    let kv_raw = read(&mut raw, g.metadata_span.0, g.metadata_span.1 - g.metadata_span.0);
    let per = (g.tensors.len() + n - 1) / n;
    let key = |out: &mut Vec<u8>, k: &str, ty: u32, v: &[u8]| {
        out.extend_from_slice(&(k.len() as u64).to_le_bytes());
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(v);
    };
    let mut paths = Vec::new();
    for k in 0..n {
        let ts = &g.tensors[(k * per).min(g.tensors.len())..((k + 1) * per).min(g.tensors.len())];
        let align = if k == 0 { g.alignment } else { 32 };
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(ts.len() as u64).to_le_bytes());
        let n_kv = 3 + if k == 0 { g.metadata.len() } else { 0 };
        out.extend_from_slice(&(n_kv as u64).to_le_bytes());
        if k == 0 {
            out.extend_from_slice(&kv_raw);
        }
        key(&mut out, "split.no", 2, &(k as u16).to_le_bytes());
        key(&mut out, "split.count", 2, &(n as u16).to_le_bytes());
        key(&mut out, "split.tensors.count", 5, &(g.tensors.len() as i32).to_le_bytes());
        let mut off = 0u64;
        let mut offs = Vec::new();
        for t in ts {
            out.extend_from_slice(&(t.name.len() as u64).to_le_bytes());
            out.extend_from_slice(t.name.as_bytes());
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for &d in &t.ne {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&t.type_id.to_le_bytes());
            out.extend_from_slice(&off.to_le_bytes());
            offs.push(off);
            off = (off + t.nbytes + align - 1) / align * align;
        }
        while out.len() as u64 % align != 0 {
            out.push(0);
        }
        let data_start = out.len() as u64;
        for (t, o) in ts.iter().zip(&offs) {
            out.resize((data_start + o) as usize, 0);
            out.extend_from_slice(&read(&mut raw, g.data_offset + t.offset, t.nbytes));
        }
        let p = PathBuf::from(split_path(&prefix.to_string_lossy(), k as u32 + 1, n as u32));
        std::fs::File::create(&p).unwrap().write_all(&out).unwrap();
        paths.push(p);
    }
    paths
}
