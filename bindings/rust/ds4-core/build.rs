// Turns the engine's generated Unicode class table (engine/tokenizer/unicode_tables.inc, rows
// `{first, last, bits},`) into a Rust array, so host and engine classify characters from one
// source. Also sets an rpath to libds4's directory for this crate's tests and examples.
use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    let src =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../../engine/tokenizer/unicode_tables.inc");
    println!("cargo:rerun-if-changed={}", src.display());
    let text = fs::read_to_string(&src).unwrap_or_else(|e| panic!("reading {}: {}", src.display(), e));
    let mut rows = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with("//") {
            continue;
        }
        rows.push_str(&t.replace('{', "(").replace('}', ")"));
        rows.push('\n');
    }
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("unicode_tables.rs");
    fs::write(
        &out,
        format!("/// (first, last, class bits), sorted.\npub static RANGES: &[(u32, u32, u8)] = &[\n{}];\n", rows),
    )
    .unwrap();
    if let Ok(dir) = env::var("DEP_DS4_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
