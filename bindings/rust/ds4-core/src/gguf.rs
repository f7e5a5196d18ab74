//! The host's own GGUF parse: identification (metadata without opening the engine) and the
//! tensor inventory of a file or a `NAME-0000K-of-0000N.gguf` split set, in the form the
//! engine accepts as a tensor directory (docs/ARCHITECTURE.md §8). Only headers are read;
//! counts and lengths are checked against the file size before anything is allocated.
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// GGML tensor type ids: (id, name, elements per block, bytes per block, held by the engine).
const TYPES: &[(u32, &str, u64, u64, bool)] = &[
    (0, "f32", 1, 4, true),
    (1, "f16", 1, 2, true),
    (2, "q4_0", 32, 18, false),
    (3, "q4_1", 32, 20, false),
    (6, "q5_0", 32, 22, false),
    (7, "q5_1", 32, 24, false),
    (8, "q8_0", 32, 34, true),
    (9, "q8_1", 32, 36, false),
    (10, "q2_k", 256, 84, true),
    (11, "q3_k", 256, 110, false),
    (12, "q4_k", 256, 144, true),
    (13, "q5_k", 256, 176, false),
    (14, "q6_k", 256, 210, false),
    (15, "q8_k", 256, 292, false),
    (16, "iq2_xxs", 256, 66, true),
    (17, "iq2_xs", 256, 74, false),
    (18, "iq3_xxs", 256, 98, false),
    (19, "iq1_s", 256, 50, false),
    (20, "iq4_nl", 32, 18, false),
    (21, "iq3_s", 256, 110, false),
    (22, "iq2_s", 256, 82, false),
    (23, "iq4_xs", 256, 136, false),
    (24, "i8", 1, 1, false),
    (25, "i16", 1, 2, false),
    (26, "i32", 1, 4, true),
    (27, "i64", 1, 8, false),
    (28, "f64", 1, 8, false),
    (29, "iq1_m", 256, 56, false),
    (30, "bf16", 1, 2, true),
];

fn type_traits(id: u32) -> Option<&'static (u32, &'static str, u64, u64, bool)> {
    TYPES.iter().find(|t| t.0 == id)
}

/// The name the engine uses for a GGML type id ("?" when unknown).
pub fn type_name(id: u32) -> &'static str {
    type_traits(id).map(|t| t.1).unwrap_or("?")
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(Vec<u8>),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::Uint(u) if u <= i64::MAX as u64 => Some(u as i64),
            Value::Int(i) => Some(i),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&[u8]> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor as the file describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub type_id: u32,
    pub ne: Vec<i64>,
    /// 0-based split file that holds it.
    pub split: i32,
    /// Offset within that split's data section.
    pub offset: u64,
    pub nbytes: u64,
}

/// One parsed GGUF file (headers only).
#[derive(Debug)]
pub struct GgufFile {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorEntry>,
    /// Where the data section starts in the file.
    pub data_offset: u64,
    pub file_size: u64,
    /// Byte range of the metadata key/value section (for hosts that rewrite files).
    pub metadata_span: (u64, u64),
}

const MAX_ARRAY_DEPTH: u32 = 8;

struct Cursor<R: Read> {
    r: R,
    pos: u64,
    size: u64,
    src: String,
}

impl<R: Read> Cursor<R> {
    fn fail<T>(&self, msg: String) -> Result<T> {
        Err(Error::new(format!("{}: {}", self.src, msg)))
    }
    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>> {
        if n > self.size - self.pos {
            return self.fail(format!(
                "truncated file: reading {} at offset {} needs {} bytes, only {} left",
                what,
                self.pos,
                n,
                self.size - self.pos
            ));
        }
        let mut v = vec![0u8; n as usize];
        self.r.read_exact(&mut v).map_err(|e| Error::new(format!("{}: read failed: {}", self.src, e)))?;
        self.pos += n;
        Ok(v)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.bytes(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        let b = self.bytes(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.bytes(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&b);
        Ok(u64::from_le_bytes(a))
    }
    fn string(&mut self, what: &str) -> Result<Vec<u8>> {
        let n = self.u64(what)?;
        self.bytes(n, what)
    }
    fn value(&mut self, ty: u32, depth: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::Uint(self.u8("u8")? as u64),
            1 => Value::Int(self.u8("i8")? as i8 as i64),
            2 => Value::Uint(self.u16("u16")? as u64),
            3 => Value::Int(self.u16("i16")? as i16 as i64),
            4 => Value::Uint(self.u32("u32")? as u64),
            5 => Value::Int(self.u32("i32")? as i32 as i64),
            6 => Value::Float(f32::from_bits(self.u32("f32")?) as f64),
            7 => match self.u8("bool")? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return self.fail(format!("bool value {} (must be 0 or 1)", b)),
            },
            8 => Value::Str(self.string("string")?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return self.fail(format!("arrays nested deeper than {} levels", MAX_ARRAY_DEPTH));
                }
                let et = self.u32("array element type")?;
                let n = self.u64("array length")?;
                let min = match et {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4 | 5 | 6 => 4,
                    8 | 10 | 11 | 12 => 8,
                    9 => 12,
                    _ => return self.fail(format!("array has unknown element type {}", et)),
                };
                if n > (self.size - self.pos) / min {
                    return self.fail(format!("array length {} is beyond the end of the file", n));
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(et, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::Uint(self.u64("u64")?),
            11 => Value::Int(self.u64("i64")? as i64),
            12 => Value::Float(f64::from_bits(self.u64("f64")?)),
            _ => return self.fail(format!("unknown value type {}", ty)),
        })
    }
}

impl GgufFile {
    /// Parses the headers of one file (no tensor data is read).
    pub fn open(path: &Path) -> Result<GgufFile> {
        let src = path.display().to_string();
        let f = File::open(path).map_err(|e| Error::new(format!("{}: cannot open: {}", src, e)))?;
        let size = f.metadata().map_err(|e| Error::new(format!("{}: cannot stat: {}", src, e)))?.len();
        let mut c = Cursor { r: BufReader::with_capacity(1 << 16, f), pos: 0, size, src };
        let magic = c.bytes(4, "magic")?;
        if magic != b"GGUF" {
            return c.fail("bad magic (not a GGUF file)".to_string());
        }
        let version = c.u32("version")?;
        if version != 2 && version != 3 {
            return c.fail(format!("unsupported GGUF version {}", version));
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        if n_kv > (size - c.pos) / 14 || n_tensors > (size - c.pos) / 33 {
            return c.fail("tensor or metadata count is more than the file can hold".to_string());
        }
        let mut metadata = Vec::with_capacity(n_kv as usize);
        let kv_start = c.pos;
        for _ in 0..n_kv {
            let key = String::from_utf8(c.string("metadata key")?)
                .map_err(|_| Error::new(format!("{}: metadata key is not UTF-8", c.src)))?;
            if key.is_empty() {
                return c.fail("empty metadata key".to_string());
            }
            if metadata.iter().any(|(k, _): &(String, Value)| *k == key) {
                return c.fail(format!("duplicate metadata key '{}'", key));
            }
            let ty = c.u32("metadata value type")?;
            let v = c.value(ty, 0)?;
            metadata.push((key, v));
        }
        let metadata_span = (kv_start, c.pos);
        let mut alignment = 32u64;
        if let Some((_, v)) = metadata.iter().find(|(k, _)| k == "general.alignment") {
            match v.as_i64() {
                Some(a) if a > 0 && a <= 1 << 30 && (a & (a - 1)) == 0 => alignment = a as u64,
                _ => return c.fail("general.alignment is not a power of two between 1 and 2^30".to_string()),
            }
        }
        let mut tensors: Vec<TensorEntry> = Vec::with_capacity(n_tensors as usize);
        let mut seen: HashMap<String, ()> = HashMap::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = String::from_utf8(c.string("tensor name")?)
                .map_err(|_| Error::new(format!("{}: tensor name is not UTF-8", c.src)))?;
            let nd = c.u32("tensor dimension count")?;
            if nd == 0 || nd > 4 {
                return c.fail(format!("tensor '{}' has {} dimensions (must be 1 to 4)", name, nd));
            }
            let mut ne = Vec::with_capacity(nd as usize);
            let mut nel: i64 = 1;
            for _ in 0..nd {
                let e = c.u64("tensor dimension")? as i64;
                if e <= 0 {
                    return c.fail(format!("tensor '{}': dimension {} is not positive", name, e));
                }
                nel = nel
                    .checked_mul(e)
                    .ok_or_else(|| Error::new(format!("tensor '{}': element count overflows", name)))?;
                ne.push(e);
            }
            let type_id = c.u32("tensor type")?;
            let t = match type_traits(type_id) {
                Some(t) if t.4 => t,
                Some(t) => return c.fail(format!("unsupported tensor type {} in tensor '{}'", t.1, name)),
                None => return c.fail(format!("unknown tensor type {} in tensor '{}'", type_id, name)),
            };
            let offset = c.u64("tensor data offset")?;
            if ne[0] as u64 % t.2 != 0 {
                return c.fail(format!("tensor '{}': row length is not a multiple of the block size", name));
            }
            let nbytes = (ne[0] as u64 / t.2)
                .checked_mul(t.3)
                .and_then(|row| row.checked_mul((nel / ne[0]) as u64))
                .ok_or_else(|| Error::new(format!("tensor '{}': byte size overflows", name)))?;
            if seen.insert(name.clone(), ()).is_some() {
                return c.fail(format!("duplicate tensor name '{}'", name));
            }
            tensors.push(TensorEntry { name, type_id, ne, split: 0, offset, nbytes });
        }
        let data_offset = c.pos + (alignment - c.pos % alignment) % alignment;
        if !tensors.is_empty() {
            if data_offset > size {
                return c.fail("the data section starts beyond the end of the file".to_string());
            }
            let avail = size - data_offset;
            for t in &tensors {
                if t.offset % alignment != 0 || t.offset > avail || t.nbytes > avail - t.offset {
                    return c.fail(format!("tensor '{}': data lies outside the file or is misaligned", t.name));
                }
            }
        }
        Ok(GgufFile { version, alignment, metadata, tensors, data_offset, file_size: size, metadata_span })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(|v| v.as_i64())
    }
    pub fn get_str(&self, key: &str) -> Option<String> {
        self.get(key).and_then(|v| v.as_str()).map(|s| String::from_utf8_lossy(s).into_owned())
    }
}

/// `(prefix, k, n)` for a split file name `PREFIX-0000K-of-0000N.gguf` (k 1-based), the
/// inverse of [`split_path`]; None for any other name.
pub fn parse_split_path(path: &str) -> Option<(String, u32, u32)> {
    let b = path.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let t = &b[b.len() - 20..];
    let digits = |s: &[u8]| -> Option<u32> {
        if s.iter().all(|c| c.is_ascii_digit()) {
            Some(s.iter().fold(0u32, |v, c| v * 10 + (c - b'0') as u32))
        } else {
            None
        }
    };
    if t[0] != b'-' || &t[6..10] != b"-of-" || &t[15..] != b".gguf" {
        return None;
    }
    let (k, n) = (digits(&t[1..6])?, digits(&t[10..15])?);
    if n < 1 || k < 1 || k > n {
        return None;
    }
    Some((path[..path.len() - 20].to_string(), k, n))
}

/// The name of split k (1-based) of n: `PREFIX-0000K-of-0000N.gguf`.
pub fn split_path(prefix: &str, k: u32, n: u32) -> String {
    format!("{}-{:05}-of-{:05}.gguf", prefix, k, n)
}

/// What a GGUF is, from its metadata alone (the same facts as `ds4_bridge_gguf_info`).
#[derive(Clone, Debug, PartialEq)]
pub struct GgufIdentity {
    pub family: String,
    pub name: String,
    pub n_layer: i32,
    pub n_embd: i32,
    pub n_vocab: i32,
    pub n_head: i32,
    pub n_expert: i32,
    pub n_tensors: i32,
    pub split_count: i32,
    pub tensor_bytes: u64,
}

/// Identifies a GGUF (or split set, from any of its files) without opening the engine.
pub fn identify_gguf(path: impl AsRef<Path>) -> Result<GgufIdentity> {
    let inv = TensorInventory::open(path)?;
    let f = &inv.first;
    let arch = f.get_str("general.architecture").unwrap_or_default();
    let geti = |k: &str| f.get_i64(&format!("{}.{}", arch, k)).unwrap_or(0) as i32;
    Ok(GgufIdentity {
        family: arch.clone(),
        name: f.get_str("general.name").unwrap_or_default(),
        n_layer: geti("block_count"),
        n_embd: geti("embedding_length"),
        n_vocab: geti("vocab_size"),
        n_head: geti("attention.head_count"),
        n_expert: geti("expert_count"),
        n_tensors: inv.tensors.len() as i32,
        split_count: inv.paths.len() as i32,
        tensor_bytes: inv.tensors.iter().map(|t| t.nbytes).sum(),
    })
}

/// Every tensor of a model file or split set, with each entry's split remapped from its
/// shard's file name (`-0000K-of-0000N`: split K-1), in file order, plus a name index.
#[derive(Debug)]
pub struct TensorInventory {
    pub paths: Vec<PathBuf>,
    pub tensors: Vec<TensorEntry>,
    /// Per split: where its data section starts in its file.
    pub data_offsets: Vec<u64>,
    /// The first split's headers (metadata comes from it).
    pub first: GgufFile,
    index: HashMap<String, usize>,
}

fn split_key(f: &GgufFile, key: &str, path: &Path) -> Result<Option<i64>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => match v.as_i64() {
            Some(x) if x >= 0 => Ok(Some(x)),
            _ => Err(Error::new(format!("{}: {} is not a non-negative integer", path.display(), key))),
        },
    }
}

impl TensorInventory {
    /// Opens a file; a split file name (any of the set) opens the whole set.
    pub fn open(path: impl AsRef<Path>) -> Result<TensorInventory> {
        let path = path.as_ref();
        let s = path.to_string_lossy().into_owned();
        let paths: Vec<PathBuf> = match parse_split_path(&s) {
            Some((prefix, _, n)) if n > 1 => (1..=n).map(|k| PathBuf::from(split_path(&prefix, k, n))).collect(),
            _ => vec![path.to_path_buf()],
        };
        let n = paths.len();
        let mut files = Vec::with_capacity(n);
        for (k, p) in paths.iter().enumerate() {
            let f = GgufFile::open(p)?;
            let count = split_key(&f, "split.count", p)?;
            let no = split_key(&f, "split.no", p)?;
            if n == 1 {
                if count.unwrap_or(1) > 1 {
                    return Err(Error::new(format!(
                        "{}: split.count is {} but the file name is not NAME-0000K-of-0000N.gguf",
                        p.display(),
                        count.unwrap_or(0)
                    )));
                }
            } else {
                if count != Some(n as i64) {
                    return Err(Error::new(format!(
                        "{}: split.count is {:?}, the file name says {}",
                        p.display(),
                        count,
                        n
                    )));
                }
                if no != Some(k as i64) {
                    return Err(Error::new(format!("{}: split.no is {:?}, the file name says {}", p.display(), no, k)));
                }
            }
            files.push(f);
        }
        let mut tensors = Vec::new();
        let mut data_offsets = Vec::with_capacity(n);
        let mut index = HashMap::new();
        for (k, f) in files.iter_mut().enumerate() {
            data_offsets.push(f.data_offset);
            for mut t in f.tensors.drain(..) {
                t.split = k as i32;
                if index.insert(t.name.clone(), tensors.len()).is_some() {
                    return Err(Error::new(format!(
                        "{}: duplicate tensor name '{}' across splits",
                        paths[k].display(),
                        t.name
                    )));
                }
                tensors.push(t);
            }
        }
        let first = files.swap_remove(0);
        if let Some(want) = split_key(&first, "split.tensors.count", &paths[0])? {
            if want as usize != tensors.len() {
                return Err(Error::new(format!(
                    "{}: split.tensors.count is {} but the splits hold {} tensors",
                    paths[0].display(),
                    want,
                    tensors.len()
                )));
            }
        }
        Ok(TensorInventory { paths, tensors, data_offsets, first, index })
    }

    /// The slot of a tensor name.
    pub fn slot(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }
}
