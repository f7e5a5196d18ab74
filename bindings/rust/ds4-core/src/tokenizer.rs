//! The host's tokenizer: byte-level BPE over the GGUF vocabulary (`tokenizer.ggml.*`) with
//! the DeepSeek V3/V4 pre-tokenizer, the same algorithm as engine/tokenizer (checked against
//! it on the same inputs by the tests). Plain text never yields control tokens;
//! `encode_special` matches control and user-defined tokens first (leftmost, longest).
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, TensorInventory, Value};
use crate::unicode::{self as u, INVALID};
use std::cmp::Reverse;
use std::collections::HashMap;
use std::collections::{BTreeMap, BinaryHeap};
use std::path::Path;

const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

fn is_added(t: i32) -> bool {
    t == CONTROL || t == USER_DEFINED
}

pub struct Vocab {
    tokens: Vec<Vec<u8>>,
    types: Vec<i32>,
    token_to_id: HashMap<Vec<u8>, i32>,
    byte_id: [i32; 256],
    merges: HashMap<(i32, i32), (i32, i32)>, // (left, right) -> (rank, result)
    decoded: Vec<Vec<u8>>,
    specials: BTreeMap<Vec<u8>, i32>, // text -> id (first token with a text wins)
    max_special: usize,
    bos: i32,
    eos: i32,
    stops: Vec<i32>,
}

fn strings(v: Option<&Value>, key: &str) -> Result<Vec<Vec<u8>>> {
    let a = v
        .and_then(|v| v.as_array())
        .ok_or_else(|| Error::new(format!("GGUF key {} is missing or not an array", key)))?;
    a.iter()
        .map(|x| {
            x.as_str().map(|s| s.to_vec()).ok_or_else(|| Error::new(format!("GGUF key {}: expected strings", key)))
        })
        .collect()
}

impl Vocab {
    /// The vocabulary of a model file (the engine's fallback when it has none).
    pub fn open(path: impl AsRef<Path>) -> Result<Vocab> {
        let inv = TensorInventory::open(path)?;
        Vocab::from_gguf(&inv.first, &inv)
    }

    fn from_gguf(f: &GgufFile, inv: &TensorInventory) -> Result<Vocab> {
        if f.get("tokenizer.ggml.tokens").is_none() {
            let arch = f.get_str("general.architecture").unwrap_or_default();
            let n = match f.get_i64(&format!("{}.vocab_size", arch)) {
                Some(n) => n,
                None => inv.slot("token_embd.weight").map(|s| inv.tensors[s].ne[1]).unwrap_or(0),
            };
            return Vocab::byte_fallback(n as usize);
        }
        let model = f.get_str("tokenizer.ggml.model").unwrap_or_default();
        if model != "gpt2" {
            return Err(Error::new(format!("tokenizer model '{}' is not the byte-level BPE 'gpt2'", model)));
        }
        let pre = f.get_str("tokenizer.ggml.pre").unwrap_or_else(|| "deepseek-v3".to_string());
        if pre != "deepseek-v3" && pre != "deepseek-v4" {
            return Err(Error::new(format!("pre-tokenizer '{}' is not supported", pre)));
        }
        let tokens = strings(f.get("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens")?;
        let types = match f.get("tokenizer.ggml.token_type") {
            None => vec![1; tokens.len()],
            Some(v) => {
                let a = v.as_array().ok_or_else(|| Error::new("tokenizer.ggml.token_type is not an array"))?;
                a.iter().map(|x| x.as_i64().unwrap_or(-1) as i32).collect()
            }
        };
        let merges = match f.get("tokenizer.ggml.merges") {
            None => Vec::new(),
            Some(v) => strings(Some(v), "tokenizer.ggml.merges")?,
        };
        let id = |k: &str| f.get_i64(k).map(|x| x as i32).unwrap_or(-1);
        Vocab::build(
            tokens,
            types,
            &merges,
            id("tokenizer.ggml.bos_token_id"),
            id("tokenizer.ggml.eos_token_id"),
            id("tokenizer.ggml.eot_token_id"),
        )
    }

    /// The engine's byte-level fallback for models without a tokenizer: three control
    /// tokens, the 256 bytes, then reserved (unused) ids.
    pub fn byte_fallback(n_vocab: usize) -> Result<Vocab> {
        if n_vocab < 259 {
            return Err(Error::new(format!("byte fallback vocabulary needs 259 ids, the model has {}", n_vocab)));
        }
        let mut tokens: Vec<Vec<u8>> = vec![
            "<｜begin▁of▁sentence｜>".as_bytes().to_vec(),
            "<｜end▁of▁sentence｜>".as_bytes().to_vec(),
            "<｜▁pad▁｜>".as_bytes().to_vec(),
        ];
        let mut types = vec![CONTROL; 3];
        let bm = u::ByteMap::new();
        for b in 0..=255u8 {
            let mut s = Vec::new();
            u::utf8_append(&mut s, bm.to_unicode(b));
            tokens.push(s);
            types.push(1);
        }
        for i in 259..n_vocab {
            tokens.push(format!("<|reserved_{}|>", i).into_bytes());
            types.push(UNUSED);
        }
        Vocab::build(tokens, types, &[], 0, 1, -1)
    }

    fn build(tokens: Vec<Vec<u8>>, types: Vec<i32>, merges: &[Vec<u8>], bos: i32, eos: i32, eot: i32) -> Result<Vocab> {
        let n = tokens.len();
        if n == 0 || types.len() != n {
            return Err(Error::new("tokenizer: empty vocabulary or token types of another length"));
        }
        if let Some(t) = types.iter().find(|&&t| !(0..=6).contains(&t)) {
            return Err(Error::new(format!("tokenizer: {} is not a token type", t)));
        }
        for &x in &[bos, eos, eot] {
            if x < -1 || x >= n as i32 {
                return Err(Error::new(format!("tokenizer: special token id {} outside the vocabulary", x)));
            }
        }
        let mut token_to_id: HashMap<Vec<u8>, i32> = HashMap::with_capacity(n);
        for pass in 0..2 {
            for i in 0..n {
                let t = types[i];
                if t == UNUSED || (pass == 0) == is_added(t) {
                    continue;
                }
                token_to_id.entry(tokens[i].clone()).or_insert(i as i32);
            }
        }
        let bm = u::ByteMap::new();
        let mut byte_id = [-1i32; 256];
        for (b, slot) in byte_id.iter_mut().enumerate() {
            let mut s = Vec::new();
            u::utf8_append(&mut s, bm.to_unicode(b as u8));
            *slot = token_to_id.get(&s).copied().unwrap_or(-1);
        }
        let mut mm = HashMap::with_capacity(merges.len());
        for (r, m) in merges.iter().enumerate() {
            let sp = m.iter().skip(1).position(|&c| c == b' ').map(|p| p + 1);
            let sp = match sp {
                Some(sp) if sp + 1 < m.len() => sp,
                _ => {
                    return Err(Error::new(format!(
                        "tokenizer.ggml.merges[{}] is not two tokens separated by a space",
                        r
                    )))
                }
            };
            let (a, b) = (&m[..sp], &m[sp + 1..]);
            let ab: Vec<u8> = [a, b].concat();
            match (token_to_id.get(a), token_to_id.get(b), token_to_id.get(&ab)) {
                (Some(&ia), Some(&ib), Some(&ic)) => {
                    mm.insert((ia, ib), (r as i32, ic));
                }
                _ => return Err(Error::new(format!("tokenizer.ggml.merges[{}] refers to a missing token", r))),
            }
        }
        let mut decoded = Vec::with_capacity(n);
        for i in 0..n {
            let t = &tokens[i];
            if is_added(types[i]) || types[i] == UNUSED {
                decoded.push(t.clone());
                continue;
            }
            let mut d = Vec::with_capacity(t.len());
            let mut k = 0;
            while k < t.len() {
                let (cp, len) = u::utf8_decode(t, k);
                match if cp == INVALID { None } else { bm.to_byte(cp) } {
                    Some(b) => d.push(b),
                    None => d.extend_from_slice(&t[k..k + len]),
                }
                k += len;
            }
            decoded.push(d);
        }
        let mut specials = BTreeMap::new();
        let mut max_special = 0;
        for i in 0..n {
            if is_added(types[i]) && !tokens[i].is_empty() {
                max_special = max_special.max(tokens[i].len());
                specials.entry(tokens[i].clone()).or_insert(i as i32);
            }
        }
        let mut stops = Vec::new();
        if eos >= 0 {
            stops.push(eos);
        }
        if eot >= 0 && eot != eos {
            stops.push(eot);
        }
        Ok(Vocab { tokens, types, token_to_id, byte_id, merges: mm, decoded, specials, max_special, bos, eos, stops })
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
    pub fn bos(&self) -> i32 {
        self.bos
    }
    pub fn eos(&self) -> i32 {
        self.eos
    }
    pub fn is_stop(&self, id: i32) -> bool {
        self.stops.contains(&id)
    }
    /// Control or user-defined (matched only on the special path).
    pub fn is_special(&self, id: i32) -> bool {
        id >= 0 && (id as usize) < self.types.len() && is_added(self.types[id as usize])
    }
    /// The id of the token stored exactly as `text`.
    pub fn find(&self, text: &[u8]) -> Option<i32> {
        self.token_to_id.get(text).copied()
    }

    /// Decoded bytes of one token.
    pub fn token_bytes(&self, id: i32) -> Result<&[u8]> {
        if id < 0 || id as usize >= self.decoded.len() {
            return Err(Error::new(format!(
                "token id {} is outside the vocabulary of {} tokens",
                id,
                self.decoded.len()
            )));
        }
        Ok(&self.decoded[id as usize])
    }

    /// Raw bytes of the ids (not necessarily valid UTF-8 when cut inside a character).
    pub fn decode(&self, ids: &[i32]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(out)
    }

    /// Plain text: special-token strings are ordinary text.
    pub fn encode(&self, text: &[u8]) -> Vec<i32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_plain(text, &mut out);
        out
    }

    /// Rendered text: control and user-defined tokens match first (leftmost, longest).
    pub fn encode_special(&self, text: &[u8]) -> Vec<i32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let (mut seg, mut pos) = (0, 0);
        while pos < text.len() {
            match self.match_special(text, pos) {
                None => pos += 1,
                Some((id, len)) => {
                    self.encode_plain(&text[seg..pos], &mut out);
                    out.push(id);
                    pos += len;
                    seg = pos;
                }
            }
        }
        self.encode_plain(&text[seg..], &mut out);
        out
    }

    fn match_special(&self, text: &[u8], pos: usize) -> Option<(i32, usize)> {
        let longest = self.max_special.min(text.len() - pos);
        (1..=longest).rev().find_map(|l| self.specials.get(&text[pos..pos + l]).map(|&id| (id, l)))
    }

    fn encode_plain(&self, text: &[u8], out: &mut Vec<i32>) {
        for (b, e) in pretokenize(text) {
            let word = &text[b..e];
            if word.len() == 1 {
                let id = self.byte_id[word[0] as usize];
                if id >= 0 {
                    out.push(id);
                }
                continue;
            }
            self.bpe(word, out);
        }
    }

    // Lowest rank first, leftmost among equal ranks; bytes missing from the vocabulary are
    // dropped (as HF does without an unknown token).
    fn bpe(&self, word: &[u8], out: &mut Vec<i32>) {
        struct Sym {
            id: i32,
            prev: i32,
            next: i32,
            live: bool,
        }
        let mut syms: Vec<Sym> = Vec::with_capacity(word.len());
        for &c in word {
            let id = self.byte_id[c as usize];
            if id < 0 {
                continue;
            }
            let i = syms.len() as i32;
            syms.push(Sym { id, prev: i - 1, next: i + 1, live: true });
        }
        if syms.is_empty() {
            return;
        }
        syms.last_mut().unwrap().next = -1;
        let mut heap: BinaryHeap<Reverse<(i32, i32, i32)>> = BinaryHeap::new(); // (rank, pos, result)
        for i in 0..syms.len() - 1 {
            if let Some(&(r, res)) = self.merges.get(&(syms[i].id, syms[i + 1].id)) {
                heap.push(Reverse((r, i as i32, res)));
            }
        }
        while let Some(Reverse((_, pos, result))) = heap.pop() {
            let p = pos as usize;
            if !syms[p].live || syms[p].next < 0 {
                continue;
            }
            let rn = syms[p].next as usize;
            match self.merges.get(&(syms[p].id, syms[rn].id)) {
                Some(&(_, res)) if res == result => {}
                _ => continue, // stale: the pair here changed since it was queued
            }
            syms[p].id = result;
            syms[rn].live = false;
            syms[p].next = syms[rn].next;
            if syms[p].next >= 0 {
                let nn = syms[p].next as usize;
                syms[nn].prev = pos;
            }
            if syms[p].prev >= 0 {
                let pp = syms[p].prev as usize;
                if let Some(&(r, res)) = self.merges.get(&(syms[pp].id, syms[p].id)) {
                    heap.push(Reverse((r, pp as i32, res)));
                }
            }
            if syms[p].next >= 0 {
                let nn = syms[p].next as usize;
                if let Some(&(r, res)) = self.merges.get(&(syms[p].id, syms[nn].id)) {
                    heap.push(Reverse((r, pos, res)));
                }
            }
        }
        let mut i = 0i32;
        while i >= 0 {
            out.push(syms[i as usize].id);
            i = syms[i as usize].next;
        }
    }
}

// --- the DeepSeek V3 pre-tokenizer: three isolating Splits (see engine/tokenizer/pretokenize.h)

struct Ch {
    cp: u32,
    off: usize,
    cls: u8,
}

fn is_crlf(c: u32) -> bool {
    c == '\r' as u32 || c == '\n' as u32
}
fn is_ascii_alpha(c: u32) -> bool {
    let l = c | 0x20;
    (b'a' as u32..=b'z' as u32).contains(&l)
}
fn is_ascii_punct(c: u32) -> bool {
    (0x21..=0x2F).contains(&c) || (0x3A..=0x40).contains(&c) || (0x5B..=0x60).contains(&c) || (0x7B..=0x7E).contains(&c)
}
fn is_cjk_kana(c: u32) -> bool {
    (0x4E00..=0x9FA5).contains(&c) || (0x3040..=0x30FF).contains(&c)
}

/// The pieces of `text` as byte ranges, in order, covering it.
pub fn pretokenize(text: &[u8]) -> Vec<(usize, usize)> {
    let mut ch = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let (cp, len) = u::utf8_decode(text, i);
        ch.push(Ch { cp, off: i, cls: if cp == INVALID { 0 } else { u::char_class(cp) } });
        i += len;
    }
    let mut sp = Splitter { ch: &ch, size: text.len(), out: Vec::new() };
    if !ch.is_empty() {
        sp.digits(0, ch.len());
    }
    sp.out
}

struct Splitter<'a> {
    ch: &'a [Ch],
    size: usize,
    out: Vec<(usize, usize)>,
}

impl<'a> Splitter<'a> {
    fn digits(&mut self, b: usize, e: usize) {
        let (mut gap, mut i) = (b, b);
        while i < e {
            if self.ch[i].cls & u::N == 0 {
                i += 1;
                continue;
            }
            if gap < i {
                self.cjk(gap, i);
            }
            let mut j = i;
            while j < e && j - i < 3 && self.ch[j].cls & u::N != 0 {
                j += 1;
            }
            self.cjk(i, j);
            i = j;
            gap = j;
        }
        if gap < e {
            self.cjk(gap, e);
        }
    }

    fn cjk(&mut self, b: usize, e: usize) {
        let (mut gap, mut i) = (b, b);
        while i < e {
            if !is_cjk_kana(self.ch[i].cp) {
                i += 1;
                continue;
            }
            if gap < i {
                self.main(gap, i);
            }
            let mut j = i;
            while j < e && is_cjk_kana(self.ch[j].cp) {
                j += 1;
            }
            self.main(i, j);
            i = j;
            gap = j;
        }
        if gap < e {
            self.main(gap, e);
        }
    }

    fn main(&mut self, b: usize, e: usize) {
        let (mut gap, mut p) = (b, b);
        while p < e {
            let q = self.match_main(p, e);
            if q == p {
                p += 1;
                continue;
            }
            if gap < p {
                self.emit(gap, p);
            }
            self.emit(p, q);
            p = q;
            gap = q;
        }
        if gap < e {
            self.emit(gap, e);
        }
    }

    fn match_main(&self, p: usize, e: usize) -> usize {
        let ch = self.ch;
        let c = ch[p].cp;
        let k = ch[p].cls;
        let lm = u::L | u::M;
        let ps = u::P | u::S;
        // [!"#...~][A-Za-z]+
        if is_ascii_punct(c) && p + 1 < e && is_ascii_alpha(ch[p + 1].cp) {
            let mut q = p + 2;
            while q < e && is_ascii_alpha(ch[q].cp) {
                q += 1;
            }
            return q;
        }
        // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
        if !is_crlf(c) && k & (u::L | ps) == 0 && p + 1 < e && ch[p + 1].cls & lm != 0 {
            let mut q = p + 2;
            while q < e && ch[q].cls & lm != 0 {
                q += 1;
            }
            return q;
        }
        if k & lm != 0 {
            let mut q = p + 1;
            while q < e && ch[q].cls & lm != 0 {
                q += 1;
            }
            return q;
        }
        //  ?[\p{P}\p{S}]+[\r\n]*
        let s = p + if c == ' ' as u32 { 1 } else { 0 };
        if s < e && ch[s].cls & ps != 0 {
            let mut q = s + 1;
            while q < e && ch[q].cls & ps != 0 {
                q += 1;
            }
            while q < e && is_crlf(ch[q].cp) {
                q += 1;
            }
            return q;
        }
        if k & u::SPACE == 0 {
            return p;
        }
        let mut r = p;
        let mut last_nl = e;
        while r < e && ch[r].cls & u::SPACE != 0 {
            if is_crlf(ch[r].cp) {
                last_nl = r;
            }
            r += 1;
        }
        if last_nl != e {
            return last_nl + 1; // \s*[\r\n]+
        }
        if r == e {
            return e; // \s+(?!\S) at the end of the piece
        }
        if r - p >= 2 {
            return r - 1; // \s+(?!\S) leaves the last space to the next token
        }
        r // \s+
    }

    fn emit(&mut self, b: usize, e: usize) {
        let end = if e < self.ch.len() { self.ch[e].off } else { self.size };
        self.out.push((self.ch[b].off, end));
    }
}
