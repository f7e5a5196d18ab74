//! Models and sessions through ds4-core: open/close, sync/eval/argmax/sample, rewind and
//! generation, errors as Err, the prefill checkpoint.
mod common;
use common::*;
use ds4_core::{Model, OpenOptions, Sampling};

#[test]
fn open_reports_the_model_and_errors_come_back_as_err() {
    let m = open();
    let info = m.info().unwrap();
    assert_eq!(info.family, "deepseek4");
    assert_eq!(info.n_vocab, m.vocab_size());
    assert_eq!(info.fingerprint, m.fingerprint());
    assert!(info.n_layer > 0 && info.n_embd > 0);

    let e = Model::open("/nonexistent/model.gguf").err().expect("opening a missing file fails");
    assert!(e.message().contains("/nonexistent/model.gguf"), "{}", e);
    let e = OpenOptions::new(model_path()).threads(-3).open().err().unwrap();
    assert!(e.message().contains("n_threads"), "{}", e);
    assert!(m.session(0).err().unwrap().message().contains("ctx_size"));

    let mut s = m.session(64).unwrap();
    assert!(s.argmax().err().unwrap().message().contains("no logits"));
    assert!(s.eval(m.vocab_size()).is_err(), "a token outside the vocabulary is an error");
    assert_eq!(s.pos(), 0);
    assert!(s.sync(&[]).is_err());
}

#[test]
fn sync_eval_argmax_sample() {
    let m = open();
    let p = prompt(&m, "import os\nimport sys\n\ndef main(argv):\n    ");
    let mut a = m.session(256).unwrap();
    a.sync(&p).unwrap();
    assert_eq!(a.pos() as usize, p.len());
    let logits = a.logits().unwrap();
    assert_eq!(logits.len(), m.vocab_size() as usize);
    // argmax is the largest logit, lowest id on ties.
    let best = logits.iter().enumerate().fold(0, |b, (i, &x)| if x > logits[b] { i } else { b });
    assert_eq!(a.argmax().unwrap(), best as i32);
    // Greedy sampling is argmax; top_logprobs starts with it.
    let mut rng = 7u64;
    assert_eq!(a.sample(&Sampling::default(), &mut rng).unwrap(), best as i32);
    assert_eq!(a.top_logprobs(3).unwrap()[0].0, best as i32);

    // The same seed samples the same tokens; the rng advances.
    let hot = Sampling { temperature: 0.9, top_k: 40, top_p: 0.95, min_p: 0.0 };
    let (mut r1, mut r2) = (42u64, 42u64);
    let t1 = a.sample(&hot, &mut r1).unwrap();
    let t2 = a.sample(&hot, &mut r2).unwrap();
    assert_eq!(t1, t2);
    assert_ne!(r1, 42);

    // eval continues the same history as a sync of the longer prompt.
    a.eval(best as i32).unwrap();
    let mut b = m.session(256).unwrap();
    let mut longer = p.clone();
    longer.push(best as i32);
    for &t in &longer {
        b.eval(t).unwrap();
    }
    let (la, lb) = (a.logits().unwrap(), b.logits().unwrap());
    let max_diff = la.iter().zip(&lb).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(max_diff < 1e-3, "token-by-token and prompt prefill differ by {}", max_diff);
    assert_eq!(a.argmax().unwrap(), b.argmax().unwrap());
}

#[test]
fn rewind_and_generation() {
    let m = open();
    let p = prompt(&m, "class Queue:\n    def put(self, item):\n        ");
    let mut s = m.session(128).unwrap();
    let g0 = s.generation();
    s.sync(&p).unwrap();
    let full = s.logits().unwrap();
    let g1 = s.generation();

    let e = s.rewind(p.len() as i32 + 1).err().unwrap();
    assert!(e.message().contains("position must be in"), "{}", e);
    assert_eq!(s.pos() as usize, p.len());
    assert_eq!(s.generation(), g1, "a rejected rewind changes nothing");

    s.rewind(p.len() as i32 - 3).unwrap();
    assert_eq!(s.pos() as usize, p.len() - 3);
    assert!(s.generation() > g1, "rewinding drops history: new generation");
    for &t in &p[p.len() - 3..] {
        s.eval(t).unwrap();
    }
    let again = s.logits().unwrap();
    let d = full.iter().zip(&again).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(d < 1e-3, "rewound and replayed logits differ by {}", d);

    let g2 = s.generation();
    s.invalidate().unwrap();
    assert_eq!(s.pos(), 0);
    assert!(s.generation() > g2);
    assert!(g0 <= g1);
}

#[test]
fn prefill_checkpoint_sees_the_prefix_and_saves_it() {
    let m = open();
    let text = "def f(x):\n    return x + 1\n\n".repeat(160);
    let p = prompt(&m, &text);
    let mut s = m.session(8192).unwrap();
    let cap = s.prefill_cap() as usize; // the chunk size decides where the frontiers are
    assert!(cap > 0);
    assert!(p.len() > cap, "the prompt ({}) must span several chunks of {}", p.len(), cap);
    let dir = TempDir::new("ckpt");
    let mut seen = Vec::new();
    let mut saved = None;
    s.sync_with_progress(&p, |cp| {
        assert_eq!(cp.prefix(), &p[..cp.current()]);
        assert_eq!(cp.total(), p.len());
        seen.push(cp.current());
        if saved.is_none() {
            let path = dir.file("frontier.dsv4");
            cp.save_payload(&path).unwrap();
            saved = Some((cp.current(), path, cp.payload().unwrap()));
        }
    })
    .unwrap();
    assert_eq!(*seen.last().unwrap(), p.len());
    assert!(seen.windows(2).all(|w| w[0] < w[1]));
    let (at, path, mem) = saved.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), mem, "file and memory payloads at one frontier are the same bytes");

    // The payload saved at the frontier is the session that holds prompt[..at].
    let mut r = m.session(8192).unwrap();
    r.load_payload(&path).unwrap();
    assert_eq!(r.pos() as usize, at);
    let mut fresh = m.session(8192).unwrap();
    fresh.sync(&p[..at]).unwrap();
    assert_eq!(bits(&r.logits().unwrap()), bits(&fresh.logits().unwrap()));
}

#[test]
fn a_panicking_progress_callback_is_caught() {
    let m = open();
    let p = prompt(&m, &"x = [1, 2, 3]\n".repeat(60));
    let mut s = m.session(1024).unwrap();
    let e = s.sync_with_progress(&p, |_| panic!("callback gave up")).err().expect("the panic comes back as Err");
    assert!(e.message().contains("callback gave up"), "{}", e);
    // The engine finished the prefill; the session is usable.
    assert_eq!(s.pos() as usize, p.len());
    s.eval(p[1]).unwrap();
}
