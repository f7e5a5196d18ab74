//! The host's session ledger against the engine's own sync: over a sequence of prompts the
//! plan predicts exactly when the engine drops history (a new generation), the ledger's
//! explicit rewind + prefill gives the logits of the engine's own sync bit for bit, and
//! checkpoints go stale with the generation.
mod common;
use common::*;
use ds4_core::ledger::Ledger;

#[test]
fn ledger_plans_what_the_engine_does() {
    let m = open();
    let base = prompt(&m, "import os\nimport sys\n\ndef main():\n    args = sys.argv[1:]\n");
    let other = prompt(&m, "class Stack:\n    def __init__(self):\n        self.items = []\n");
    let mut extended = base.clone();
    extended.extend(m.tokenize(b"    if not args:\n        return 1\n").unwrap());
    let mut edited = base.clone();
    let k = edited.len() - 4;
    edited[k] = other[3];
    let prompts = vec![
        base.clone(),
        extended.clone(),    // pure extension: nothing dropped
        extended.clone(),    // the same prompt again: only the last token re-evaluated
        base[..10].to_vec(), // a prefix: drop the rest
        edited.clone(),      // diverges near the end
        other.clone(),       // diverges at once (after BOS)
        other[..1].to_vec(), // down to BOS alone
    ];

    let mut a = m.session(256).unwrap(); // driven by the ledger
    let mut b = m.session(256).unwrap(); // the engine's own sync
    let mut l = Ledger::new(&a).unwrap();
    let mut prev_cp = l.checkpoint();
    for (i, p) in prompts.iter().enumerate() {
        let plan = l.plan(p);
        assert!(plan.keep <= plan.common && (plan.keep < p.len() || plan.prefill == 0));
        let gb = b.generation();
        b.sync(p).unwrap();
        assert_eq!(b.generation() != gb, plan.rewinds, "prompt {}: {:?}", i, plan);
        let done = l.sync(&mut a, p).unwrap();
        assert_eq!(done, plan);
        assert_eq!(l.timeline(), &p[..]);
        assert_eq!(a.pos() as usize, p.len());
        assert_eq!(bits(&a.logits().unwrap()), bits(&b.logits().unwrap()), "prompt {}", i);
        assert_eq!(l.is_live(&prev_cp), !plan.rewinds, "prompt {}", i);
        prev_cp = l.checkpoint();
    }

    // Eval and rewind through the ledger keep it in step.
    let t = a.argmax().unwrap();
    l.eval(&mut a, t).unwrap();
    assert_eq!(l.timeline().len(), a.pos() as usize);
    let cp = l.checkpoint();
    l.rewind(&mut a, 1).unwrap();
    assert!(!l.is_live(&cp));
    // A change behind the ledger's back is detected, not silently planned over.
    a.eval(other[1]).unwrap();
    let e = l.sync(&mut a, &base).err().unwrap();
    assert!(e.message().contains("out of step"), "{}", e);
}
