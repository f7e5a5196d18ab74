//! The character classes and UTF-8 rules the pre-tokenizer needs, from the same generated
//! table as the engine (engine/tokenizer/unicode_tables.inc, turned into Rust by build.rs).

pub const L: u8 = 1;
pub const M: u8 = 2;
pub const N: u8 = 4;
pub const P: u8 = 8;
pub const S: u8 = 16;
pub const SPACE: u8 = 32;

/// A byte that does not start a valid UTF-8 sequence: one character with no class.
pub const INVALID: u32 = 0xFFFF_FFFF;

include!(concat!(env!("OUT_DIR"), "/unicode_tables.rs"));

/// Class bits of a code point (0 for unassigned, controls, invalid).
pub fn char_class(cp: u32) -> u8 {
    match RANGES.binary_search_by(|r| {
        if r.1 < cp {
            std::cmp::Ordering::Less
        } else if r.0 > cp {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    }) {
        Ok(i) => RANGES[i].2,
        Err(_) => 0,
    }
}

/// Decodes the sequence at s[i]: (code point, length), or (INVALID, 1) for a byte that does
/// not start a well-formed sequence (stray continuation, overlong, surrogate, > U+10FFFF,
/// truncated), exactly as the engine does.
pub fn utf8_decode(s: &[u8], i: usize) -> (u32, usize) {
    let c = s[i];
    if c < 0x80 {
        return (c as u32, 1);
    }
    let (len, mut v, lo, hi) = match c {
        0xC2..=0xDF => (2, (c & 0x1F) as u32, 0x80, 0xBF),
        0xE0..=0xEF => (3, (c & 0x0F) as u32, if c == 0xE0 { 0xA0 } else { 0x80 }, if c == 0xED { 0x9F } else { 0xBF }),
        0xF0..=0xF4 => (4, (c & 0x07) as u32, if c == 0xF0 { 0x90 } else { 0x80 }, if c == 0xF4 { 0x8F } else { 0xBF }),
        _ => return (INVALID, 1),
    };
    if i + len > s.len() {
        return (INVALID, 1);
    }
    for k in 1..len {
        let b = s[i + k];
        let (l, h) = if k == 1 { (lo, hi) } else { (0x80, 0xBF) };
        if b < l || b > h {
            return (INVALID, 1);
        }
        v = (v << 6) | (b & 0x3F) as u32;
    }
    (v, len)
}

pub fn utf8_append(out: &mut Vec<u8>, cp: u32) {
    if let Some(c) = char::from_u32(cp) {
        let mut b = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
    }
}

/// GPT-2's byte-level alphabet: every byte maps to one printable code point; the printable
/// ones to themselves, the rest to 256, 257, ... in byte order.
pub struct ByteMap {
    to_cp: [u32; 256],
    to_byte: [i16; 324], // the alphabet lies in [0, 324)
}

impl ByteMap {
    pub fn new() -> ByteMap {
        let mut m = ByteMap { to_cp: [0; 256], to_byte: [-1; 324] };
        let mut extra = 0;
        for b in 0..256u32 {
            let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
            let cp = if printable {
                b
            } else {
                extra += 1;
                255 + extra
            };
            m.to_cp[b as usize] = cp;
            m.to_byte[cp as usize] = b as i16;
        }
        m
    }
    pub fn to_unicode(&self, b: u8) -> u32 {
        self.to_cp[b as usize]
    }
    pub fn to_byte(&self, cp: u32) -> Option<u8> {
        self.to_byte.get(cp as usize).and_then(|&b| if b < 0 { None } else { Some(b as u8) })
    }
}

impl Default for ByteMap {
    fn default() -> Self {
        ByteMap::new()
    }
}
