//! The host's tokenizer against the engine's on the same inputs: the trained model's BPE
//! vocabulary over the repository's own text and crafted Unicode, the special path, decoding,
//! special and stop tokens; and the byte-level fallback vocabulary of a random model.
mod common;
use common::*;
use ds4_core::{Model, OpenOptions, Vocab};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

// Text files of the repository (Python, Markdown, C++), in a fixed order.
fn corpus() -> Vec<Vec<u8>> {
    let mut files = Vec::new();
    for d in ["tools/train", "tools/reference", "docs", "engine/tokenizer", "bridge", "."] {
        let mut names: Vec<PathBuf> = std::fs::read_dir(repo().join(d))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                matches!(p.extension().and_then(|e| e.to_str()), Some("py") | Some("md") | Some("cpp") | Some("h"))
            })
            .collect();
        names.sort();
        files.extend(names);
    }
    let mut texts: Vec<Vec<u8>> = files.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(texts.len() > 10);
    for s in [
        "",
        " ",
        "  \n\n\t  x",
        "a  b   c    \r\n\r\n  ",
        "1234567890 12 3.14159 ١٢٣ ⅷ",
        "日本語のテキスト、カタカナ。中文文本！한국어",
        "émigré naïve café — “quotes” ‘single’ … ©®™",
        "Ελληνικά Русский текст עברית العربية हिन्दी",
        "emoji 😀👍🏽 🇩🇪 zwj 👨‍👩‍👧",
        "combining e\u{301} a\u{308}\u{304} q\u{323}",
        "x<｜User｜>y<｜end▁of▁sentence｜>z<think></think>",
        "\u{0}\u{1}\u{7f}\u{85}\u{a0}\u{2028}\u{3000}",
        "'s 't 're 've 'm 'll 'd ?!... ;; ## @@ $$",
    ] {
        texts.push(s.as_bytes().to_vec());
    }
    // Bytes that are not UTF-8: stray continuations, overlong forms, surrogates, truncation.
    texts.push(vec![0x80, b'a', 0xC0, 0xAF, b' ', 0xED, 0xA0, 0x80, b'b', 0xF4, 0x90, 0x80, 0x80, 0xE2, 0x82]);
    texts.push((0u8..=255).collect());
    texts
}

fn check_model(path: &Path, m: &Model) {
    let v = Vocab::open(path).unwrap();
    assert_eq!(v.len(), m.vocab_size() as usize);
    assert_eq!(v.eos(), m.eos());
    for id in 0..v.len() as i32 {
        assert_eq!(v.is_stop(id), m.is_stop(id), "stop token {}", id);
    }
    let mut n_tokens = 0;
    for t in corpus() {
        let host = v.encode(&t);
        assert_eq!(host, m.tokenize(&t).unwrap(), "plain text {:?}", String::from_utf8_lossy(&t[..t.len().min(80)]));
        assert_eq!(
            v.encode_special(&t),
            m.tokenize_special(&t).unwrap(),
            "special path {:?}",
            String::from_utf8_lossy(&t[..t.len().min(80)])
        );
        assert_eq!(v.decode(&host).unwrap(), m.detokenize(&host).unwrap());
        n_tokens += host.len();
    }
    assert!(n_tokens > 1000);
    // Every id decodes as the engine decodes it.
    let all: Vec<i32> = (0..v.len() as i32).collect();
    assert_eq!(v.decode(&all).unwrap(), m.detokenize(&all).unwrap());
    assert!(v.decode(&[v.len() as i32]).is_err());
    assert!(m.detokenize(&[v.len() as i32]).is_err());
}

#[test]
fn trained_vocabulary_matches_the_engine() {
    let m = open();
    check_model(&model_path(), &m);
    let v = Vocab::open(model_path()).unwrap();
    // Control tokens are special and never come out of plain text.
    assert!(v.is_special(v.bos()) && v.is_special(v.eos()));
    let bos_text = v.token_bytes(v.bos()).unwrap().to_vec();
    assert!(!v.encode(&bos_text).contains(&v.bos()));
    assert_eq!(v.encode_special(&bos_text), vec![v.bos()]);
}

#[test]
fn byte_fallback_vocabulary_matches_the_engine() {
    let bin = std::env::var("DS4_BIN_DIR").expect("DS4_BIN_DIR must name the build's bin/ (ctest sets it)");
    let dir = TempDir::new("tiny");
    let path = dir.file("tiny.gguf");
    let st = std::process::Command::new(Path::new(&bin).join("ds4-make-model"))
        .args(["--preset", "tiny", "--quiet"])
        .arg(&path)
        .status()
        .unwrap();
    assert!(st.success());
    let m = OpenOptions::new(&path).threads(THREADS).open().unwrap();
    check_model(&path, &m);
    // The file's vocabulary is the fallback one; the host builds the same by itself.
    let file = Vocab::open(&path).unwrap();
    let built = Vocab::byte_fallback(m.vocab_size() as usize).unwrap();
    for t in corpus() {
        assert_eq!(built.encode_special(&t), file.encode_special(&t));
    }
}
