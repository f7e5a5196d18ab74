//! A batch step over several sessions gives each the logits it gets alone.
mod common;
use common::*;

#[test]
fn a_batch_step_equals_each_session_alone() {
    let m = open();
    let pa = prompt(&m, "def area(r):\n    return 3.14 * r * r\n");
    let pb = prompt(&m, "import json\n");
    let (mut a, mut b) = (m.session(128).unwrap(), m.session(128).unwrap());
    let (mut a1, mut b1) = (m.session(128).unwrap(), m.session(128).unwrap());
    b.sync(&pb).unwrap();
    b1.sync(&pb).unwrap();
    let next_b = [b.argmax().unwrap()];
    let mut batch = m.batch().unwrap();
    // a: a prefill chunk; b: one decode token.
    batch.eval(&mut [(&mut a, &pa[..]), (&mut b, &next_b[..])]).unwrap();
    a1.sync(&pa).unwrap();
    b1.eval(next_b[0]).unwrap();
    assert_eq!(bits(&a.logits().unwrap()), bits(&a1.logits().unwrap()));
    assert_eq!(bits(&b.logits().unwrap()), bits(&b1.logits().unwrap()));
    let st = batch.stats().unwrap();
    assert_eq!((st.steps, st.rows, st.sessions, st.failed), (1, pa.len() as u64 + 1, 2, 0));

    // A rejected step changes nothing.
    let g = a.generation();
    let e = batch.eval(&mut [(&mut a, &[][..])]).err().unwrap();
    assert!(e.message().contains("counts[0]"), "{}", e);
    assert_eq!((a.pos() as usize, a.generation()), (pa.len(), g));
}
