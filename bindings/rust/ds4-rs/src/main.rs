//! ds4-rs: generates a continuation of a prompt in process, through ds4-core alone.
//!
//!   ds4-rs generate -m MODEL [-n TOKENS] [--temp T] [--seed S] [--ctx N] [--threads N] "PROMPT"
//!
//! The prompt is tokenized by the host's tokenizer (ds4_core::Vocab), prefixed with BOS;
//! generation stops at a stop token or after TOKENS tokens. Output is streamed as raw bytes.
use ds4_core::{OpenOptions, Sampling, Vocab};
use std::io::Write;
use std::process::exit;

const USAGE: &str = "usage: ds4-rs generate -m MODEL [-n TOKENS] [--temp T] [--seed S] [--ctx N] [--threads N] PROMPT";

struct Args {
    model: String,
    prompt: String,
    n: usize,
    temp: f32,
    seed: u64,
    ctx: i32,
    threads: i32,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    match it.next().as_deref() {
        Some("generate") => {}
        Some("-h") | Some("--help") => {
            println!("{}", USAGE);
            exit(0)
        }
        other => return Err(format!("unknown command {:?}", other.unwrap_or(""))),
    }
    let mut a = Args { model: String::new(), prompt: String::new(), n: 64, temp: 0.0, seed: 1, ctx: 4096, threads: 0 };
    let mut prompt = None;
    while let Some(x) = it.next() {
        let mut val = |name: &str| it.next().ok_or_else(|| format!("{} needs a value", name));
        let num = |s: String, name: &str| s.parse::<f64>().map_err(|_| format!("{}: '{}' is not a number", name, s));
        match x.as_str() {
            "-m" | "--model" => a.model = val("-m")?,
            "-n" => a.n = num(val("-n")?, "-n")? as usize,
            "--temp" => a.temp = num(val("--temp")?, "--temp")? as f32,
            "--seed" => a.seed = num(val("--seed")?, "--seed")? as u64,
            "--ctx" => a.ctx = num(val("--ctx")?, "--ctx")? as i32,
            "--threads" => a.threads = num(val("--threads")?, "--threads")? as i32,
            s if s.starts_with('-') && s.len() > 1 => return Err(format!("unknown option {}", s)),
            _ if prompt.is_none() => prompt = Some(x),
            _ => return Err("more than one prompt".to_string()),
        }
    }
    if a.model.is_empty() {
        return Err("-m MODEL is required".to_string());
    }
    a.prompt = prompt.ok_or("PROMPT is required")?;
    Ok(a)
}

fn run(a: Args) -> ds4_core::Result<()> {
    let vocab = Vocab::open(&a.model)?;
    let model = OpenOptions::new(&a.model).threads(a.threads).open()?;
    let mut prompt = Vec::new();
    if vocab.bos() >= 0 {
        prompt.push(vocab.bos());
    }
    prompt.extend(vocab.encode(a.prompt.as_bytes()));
    let mut s = model.session(a.ctx)?;
    s.sync(&prompt)?;
    let sampling = Sampling { temperature: a.temp, ..Sampling::default() };
    let mut rng = a.seed;
    let out = std::io::stdout();
    let mut out = out.lock();
    let _ = out.write_all(a.prompt.as_bytes());
    for _ in 0..a.n {
        let t = s.sample(&sampling, &mut rng)?;
        if vocab.is_stop(t) {
            break;
        }
        let _ = out.write_all(vocab.token_bytes(t)?);
        let _ = out.flush();
        if s.pos() >= s.ctx() {
            break;
        }
        s.eval(t)?;
    }
    let _ = out.write_all(b"\n");
    Ok(())
}

fn main() {
    let a = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ds4-rs: {}\n{}", e, USAGE);
            exit(2)
        }
    };
    if let Err(e) = run(a) {
        eprintln!("ds4-rs: {}", e);
        exit(1)
    }
}
