//! The host-owned prefix of a session payload (docs/ARCHITECTURE.md §4): a 13×u32
//! little-endian header and the token ids; the engine's tail follows and is opaque here.
//! Same layout and checks as bridge/payload_header.h:
//!
//! word 0 magic "DSV4" · 1 version 3 · 2 ctx_size · 3 n_tokens · 4 n_layer · 5 n_embd ·
//! 6 n_vocab · 7 head_dim · 8,9 fingerprint (low first) · 10,11 tail_bytes (low first) ·
//! 12 CRC-32C of words 0..11 and the token bytes.
use crate::error::{Error, Result};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

pub const MAGIC: u32 = 0x3456_5344;
pub const VERSION: u32 = 3;
pub const HEADER_BYTES: u64 = 52;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub ctx_size: u32,
    pub n_tokens: u32,
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_vocab: u32,
    pub head_dim: u32,
    pub fingerprint: u64,
    pub tail_bytes: u64,
}

impl Header {
    /// Header + tokens + tail.
    pub fn total_bytes(&self) -> u64 {
        prefix_bytes(self.n_tokens as u64) + self.tail_bytes
    }
}

/// Bytes of the header plus n token ids.
pub fn prefix_bytes(n_tokens: u64) -> u64 {
    HEADER_BYTES + 4 * n_tokens
}

/// CRC-32C (Castagnoli, reflected, init and xorout 0xFFFFFFFF); chainable through `crc`.
pub fn crc32c(data: &[u8], crc: u32) -> u32 {
    let mut c = !crc;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
        }
    }
    !c
}

fn words(h: &Header) -> [u32; 12] {
    [
        MAGIC,
        VERSION,
        h.ctx_size,
        h.n_tokens,
        h.n_layer,
        h.n_embd,
        h.n_vocab,
        h.head_dim,
        h.fingerprint as u32,
        (h.fingerprint >> 32) as u32,
        h.tail_bytes as u32,
        (h.tail_bytes >> 32) as u32,
    ]
}

/// Header + token ids. `h.n_tokens` must equal `tokens.len()`, every token be in [0, n_vocab).
pub fn encode_prefix(h: &Header, tokens: &[i32]) -> Result<Vec<u8>> {
    if h.n_tokens as usize != tokens.len() {
        return Err(Error::new(format!("payload: header says {} tokens, {} given", h.n_tokens, tokens.len())));
    }
    if h.n_tokens > h.ctx_size {
        return Err(Error::new(format!("payload: {} tokens exceed the context of {}", h.n_tokens, h.ctx_size)));
    }
    if let Some((i, t)) = tokens.iter().enumerate().find(|(_, &t)| t < 0 || t as u32 >= h.n_vocab) {
        return Err(Error::new(format!("payload: token {} at {} is outside the vocabulary of {}", t, i, h.n_vocab)));
    }
    let mut out = Vec::with_capacity(prefix_bytes(tokens.len() as u64) as usize);
    for w in words(h).iter() {
        out.extend_from_slice(&w.to_le_bytes());
    }
    let mut body = Vec::with_capacity(tokens.len() * 4);
    for t in tokens {
        body.extend_from_slice(&t.to_le_bytes());
    }
    let crc = crc32c(&body, crc32c(&out, 0));
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

fn word(d: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]])
}

/// Checks the header and tokens at `data` (which must hold at least the prefix) of a payload
/// occupying exactly `range_len` bytes; returns the header and the tokens.
pub fn decode_prefix(data: &[u8], range_len: u64) -> Result<(Header, Vec<i32>)> {
    if (data.len() as u64) < HEADER_BYTES {
        return Err(Error::new(format!("payload: {} bytes cannot hold the {}-byte header", data.len(), HEADER_BYTES)));
    }
    if word(data, 0) != MAGIC {
        return Err(Error::new(format!("payload: bad magic {:08x} (not a DSV4 payload)", word(data, 0))));
    }
    if word(data, 1) != VERSION {
        return Err(Error::new(format!("payload: version {} (this host reads {})", word(data, 1), VERSION)));
    }
    let h = Header {
        ctx_size: word(data, 2),
        n_tokens: word(data, 3),
        n_layer: word(data, 4),
        n_embd: word(data, 5),
        n_vocab: word(data, 6),
        head_dim: word(data, 7),
        fingerprint: word(data, 8) as u64 | (word(data, 9) as u64) << 32,
        tail_bytes: word(data, 10) as u64 | (word(data, 11) as u64) << 32,
    };
    if h.n_layer == 0 || h.n_embd == 0 || h.n_vocab == 0 || h.head_dim == 0 || h.ctx_size == 0 {
        return Err(Error::new("payload: a model shape field is zero"));
    }
    if h.n_tokens > h.ctx_size {
        return Err(Error::new(format!("payload: {} tokens exceed the saved context of {}", h.n_tokens, h.ctx_size)));
    }
    let total = prefix_bytes(h.n_tokens as u64)
        .checked_add(h.tail_bytes)
        .ok_or_else(|| Error::new("payload: described length overflows"))?;
    if total != range_len {
        return Err(Error::new(format!("payload: header describes {} bytes, the range holds {}", total, range_len)));
    }
    let pre = prefix_bytes(h.n_tokens as u64);
    if (data.len() as u64) < pre {
        return Err(Error::new(format!("payload: {} bytes present, the header and tokens need {}", data.len(), pre)));
    }
    let body = &data[HEADER_BYTES as usize..pre as usize];
    let crc = crc32c(body, crc32c(&data[..48], 0));
    if crc != word(data, 12) {
        return Err(Error::new(format!("payload: header CRC {:08x} does not match {:08x}", word(data, 12), crc)));
    }
    let mut tokens = Vec::with_capacity(h.n_tokens as usize);
    for c in body.chunks_exact(4) {
        let t = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        if t < 0 || t as u32 >= h.n_vocab {
            return Err(Error::new(format!("payload: token {} is outside the vocabulary of {}", t, h.n_vocab)));
        }
        tokens.push(t);
    }
    Ok((h, tokens))
}

/// Reads and checks the prefix of the payload in bytes [offset, offset + length) of `path`:
/// the range must not overflow and must lie inside the file, then [`decode_prefix`].
pub fn read_file_prefix(path: &Path, offset: u64, length: u64) -> Result<(Header, Vec<i32>)> {
    let end = offset.checked_add(length).ok_or_else(|| {
        Error::new(format!("payload range [{}, +{}) of {} overflows", offset, length, path.display()))
    })?;
    let mut f = File::open(path).map_err(|e| Error::new(format!("cannot open payload {}: {}", path.display(), e)))?;
    let size = f.metadata().map_err(|e| Error::new(format!("cannot stat {}: {}", path.display(), e)))?.len();
    if end > size {
        return Err(Error::new(format!(
            "payload range [{}, +{}) is outside {} ({} bytes)",
            offset,
            length,
            path.display(),
            size
        )));
    }
    let read = |f: &mut File, at: u64, n: u64| -> Result<Vec<u8>> {
        let mut b = vec![0u8; n as usize];
        f.seek(SeekFrom::Start(at))
            .and_then(|_| f.read_exact(&mut b))
            .map_err(|e| Error::new(format!("reading {} failed: {}", path.display(), e)))?;
        Ok(b)
    };
    let head = read(&mut f, offset, HEADER_BYTES.min(length))?;
    if (head.len() as u64) < HEADER_BYTES {
        return decode_prefix(&head, length);
    }
    let n = word(&head, 3) as u64;
    let pre = prefix_bytes(n);
    if pre > length {
        // Let decode_prefix name the mismatch without reading past the range.
        return decode_prefix(&head, length);
    }
    let data = read(&mut f, offset, pre)?;
    decode_prefix(&data, length)
}
