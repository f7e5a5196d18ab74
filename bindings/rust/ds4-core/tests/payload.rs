//! Payloads through ds4-core and the host's prefix codec against the engine's bytes:
//! save/load in memory and in files, ranges inside larger files, and the rejections the host
//! makes before calling the engine.
mod common;
use common::*;
use ds4_core::payload::{crc32c, decode_prefix, encode_prefix, prefix_bytes, HEADER_BYTES};
use std::io::Write;

#[test]
fn crc32c_known_value() {
    assert_eq!(crc32c(b"123456789", 0), 0xE306_9283);
    assert_eq!(crc32c(b"56789", crc32c(b"1234", 0)), 0xE306_9283);
}

#[test]
fn the_host_codec_reads_and_writes_the_engines_prefix() {
    let m = open();
    let info = m.info().unwrap();
    let p = prompt(&m, "def walk(top):\n    for root, dirs, files in os.walk(top):\n");
    let mut s = m.session(200).unwrap();
    s.sync(&p).unwrap();
    let bytes = s.save_payload_mem().unwrap();
    let (h, toks) = decode_prefix(&bytes, bytes.len() as u64).unwrap();
    assert_eq!(toks, p);
    assert_eq!(h.ctx_size, 200);
    assert_eq!(h.fingerprint, m.fingerprint());
    assert_eq!(
        (h.n_layer as i32, h.n_embd as i32, h.n_vocab as i32, h.head_dim as i32),
        (info.n_layer, info.n_embd, info.n_vocab, info.head_dim)
    );
    assert_eq!(h.total_bytes(), bytes.len() as u64);
    // Re-encoding gives the engine's bytes exactly.
    let pre = encode_prefix(&h, &toks).unwrap();
    assert_eq!(&pre[..], &bytes[..prefix_bytes(p.len() as u64) as usize]);

    // A prefix the host writes around the engine's tail loads; the engine sees the host's
    // tokens (a different valid history is accepted by the prefix, the tail decides).
    let mut round = pre.clone();
    round.extend_from_slice(&bytes[pre.len()..]);
    let mut r = m.session(200).unwrap();
    r.load_payload_mem(&round).unwrap();
    assert_eq!(bits(&r.logits().unwrap()), bits(&s.logits().unwrap()));

    // The host rejects what the engine rejects.
    for (i, len) in [(12usize, bytes.len()), (0, bytes.len()), (HEADER_BYTES as usize + 2, bytes.len())] {
        let mut bad = bytes.clone();
        bad[i] ^= 0x40;
        assert!(decode_prefix(&bad, len as u64).is_err(), "flipped byte {}", i);
        let before = r.generation();
        assert!(r.load_payload_mem(&bad).is_err());
        assert_eq!(r.generation(), before, "a rejected payload leaves the session as it was");
    }
    assert!(decode_prefix(&bytes, bytes.len() as u64 - 1).is_err());
    assert!(decode_prefix(&bytes, bytes.len() as u64 + 1).is_err());
    let mut h2 = h;
    h2.n_tokens += 1;
    assert!(encode_prefix(&h2, &toks).is_err());
}

#[test]
fn save_load_files_and_ranges() {
    let m = open();
    let p = prompt(&m, "try:\n    import zlib\nexcept ImportError:\n    zlib = None\n");
    let mut s = m.session(128).unwrap();
    s.sync(&p).unwrap();
    let want = bits(&s.logits().unwrap());
    let dir = TempDir::new("payload");
    let file = dir.file("s.dsv4");
    s.save_payload(&file).unwrap();
    let mem = s.save_payload_mem().unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), mem);

    let mut r = m.session(128).unwrap();
    r.load_payload(&file).unwrap();
    assert_eq!(r.pos() as usize, p.len());
    assert_eq!(bits(&r.logits().unwrap()), want);
    // The next token continues identically.
    let t = r.argmax().unwrap();
    r.eval(t).unwrap();
    s.eval(t).unwrap();
    assert_eq!(bits(&r.logits().unwrap()), bits(&s.logits().unwrap()));

    // A payload inside a larger file.
    let packed = dir.file("packed.bin");
    let lead = vec![0xA5u8; 1000];
    let mut f = std::fs::File::create(&packed).unwrap();
    f.write_all(&lead).unwrap();
    f.write_all(&mem).unwrap();
    f.write_all(b"trailing bytes of another record").unwrap();
    drop(f);
    let size = std::fs::metadata(&packed).unwrap().len();
    let (off, len) = (lead.len() as u64, mem.len() as u64);
    let mut q = m.session(128).unwrap();
    q.load_payload_range(&packed, off, len).unwrap();
    assert_eq!(bits(&q.logits().unwrap()), want);

    // Rejections made by the host before the engine is called: its own messages (the
    // engine's errors come back prefixed "load payload range:"), the session untouched.
    let mut fresh = m.session(128).unwrap();
    let g = fresh.generation();
    let cases: Vec<(u64, u64, &str)> = vec![
        (u64::MAX - 4, 10, "overflows"),
        (off, size, "is outside"),
        (size + 1, 0, "is outside"),
        (off, len - 1, "describes"),
        (off, len + 1, "describes"),
        (off + 4, len, "magic"),
        (0, 10, "cannot hold"),
    ];
    for (o, l, why) in cases {
        let e = fresh.load_payload_range(&packed, o, l).err().unwrap_or_else(|| panic!("range {} +{} loaded", o, l));
        assert!(e.message().contains(why), "range {} +{}: {}", o, l, e);
        assert!(!e.message().starts_with("load payload range:"), "reached the engine: {}", e);
        assert_eq!((fresh.pos(), fresh.generation()), (0, g));
    }
    // A payload of another model is the host's rejection too.
    let mut other = mem.clone();
    other[32] ^= 1; // fingerprint, low word
    let crc = crc32c(&other[HEADER_BYTES as usize..prefix_bytes(p.len() as u64) as usize], crc32c(&other[..48], 0));
    other[48..52].copy_from_slice(&crc.to_le_bytes());
    let alien = dir.file("alien.dsv4");
    std::fs::write(&alien, &other).unwrap();
    let e = fresh.load_payload_range(&alien, 0, other.len() as u64).err().unwrap();
    assert!(e.message().contains("another model"), "{}", e);
    // ...and the engine agrees when asked directly.
    assert!(fresh.load_payload(&alien).is_err());
    // A tail the engine rejects comes back as the engine's error.
    let mut torn = mem.clone();
    let n = torn.len();
    torn[n - 10] ^= 0xFF;
    let torn_path = dir.file("torn.dsv4");
    std::fs::write(&torn_path, &torn).unwrap();
    let e = fresh.load_payload_range(&torn_path, 0, n as u64).err().unwrap();
    assert!(e.message().starts_with("load payload range:"), "{}", e);
    assert_eq!((fresh.pos(), fresh.generation()), (0, g));
}
