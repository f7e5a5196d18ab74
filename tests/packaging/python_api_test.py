"""The ds4 Python package against a real ds4d and the real engine.

Usage: python_api_test.py MODEL SOCKET   (ds4d serves MODEL on SOCKET, with a session store)
The in-process engine (ds4.Model) is the reference for what the daemon streams.
"""
import array
import os
import sys
import tempfile

import ds4

model_path, sock = sys.argv[1], sys.argv[2]
print("ds4 package from", os.path.dirname(ds4.__file__))

# --- in-process engine ------------------------------------------------------------------
m = ds4.Model(model_path, backend="cpu", threads=1)
info = m.info()
assert info["family"] == "deepseek4" and info["n_vocab"] == m.vocab_size > 0, info
prompt = m.tokenize("def f(x):")
assert prompt and m.detokenize(prompt) == "def f(x):", (prompt, m.detokenize(prompt))

s = m.session(ctx=256)
s.sync(prompt)
assert s.pos == len(prompt)
ref = []
for _ in range(8):
    lg = s.logits()
    assert isinstance(lg, array.array) and len(lg) == m.vocab_size
    mv = memoryview(lg)
    assert mv.format == "f" and mv.nbytes == 4 * m.vocab_size
    best = max(range(len(lg)), key=lambda i: (lg[i], -i))  # lowest id on ties
    t = s.argmax()
    assert t == best == s.sample(temperature=0.0), (t, best)
    ref.append(t)
    s.eval(t)
assert s.pos == len(prompt) + 8

# sampling is reproducible from the generator state
s.seed(7)
a = [s.sample(temperature=1.0) for _ in range(4)]
s.seed(7)
assert a == [s.sample(temperature=1.0) for _ in range(4)]

# payload round trips: memory and file, bit for bit
blob = s.payload()
s2 = m.session(ctx=256)
s2.load_payload_bytes(blob)
assert s2.pos == s.pos and s2.logits() == s.logits()
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "s.dsv4")
    s.save_payload(path)
    s3 = m.session(ctx=256)
    s3.load_payload(path)
    assert s3.pos == s.pos and s3.logits() == s.logits()
    s3.close()
try:
    s2.load_payload_bytes(b"not a payload")
    raise AssertionError("a bad payload was accepted")
except ds4.Ds4Error as e:
    assert str(e), "error without a message"
assert s2.pos == s.pos, "a refused payload changed the session"
s2.rewind(len(prompt))
assert s2.pos == len(prompt)
s2.close()

chat = m.render_chat([{"role": "user", "content": "hi"}])
assert len(chat) > 1

# --- client of ds4d ---------------------------------------------------------------------
try:
    ds4.Client("/nonexistent/ds4.sock")
    raise AssertionError("connected to nothing")
except ds4.ConnectError as e:
    assert "cannot connect" in str(e), e

with ds4.Client(sock) as c:
    mi = c.model_info()
    assert mi.n_vocab == m.vocab_size and mi.family == "deepseek4", mi
    assert mi.chat_template is False, mi   # the tiny generated model has no chat template
    assert c.tokenize("def f(x):") == prompt
    assert c.detokenize(ref) == m.detokenize(ref)

    g = c.generate(tokens=prompt, max_tokens=8, ignore_eos=True)
    chunks = list(g)
    got = [t for ch in chunks for t in ch.tokens]
    assert got == ref, (got, ref)
    assert "".join(ch.text for ch in chunks) == m.detokenize(ref)
    assert g.done.reason == "length" and g.done.generated_tokens == 8, g.done

    # sampling controls: logprobs leave greedy tokens as they are, each the most likely;
    # a -100 bias on the first one changes it; penalty values reach the daemon (a bad one is refused)
    chunks = list(c.generate(tokens=prompt, max_tokens=8, ignore_eos=True, logprobs=True, top_logprobs=2))
    assert [t for ch in chunks for t in ch.tokens] == ref
    lps = [lp for ch in chunks for lp in ch.logprobs]
    assert len(lps) == 8 and all(lp[0] <= 0 and len(lp[1]) == 2 for lp in lps), lps
    assert [lp[1][0][0] for lp in lps] == ref and all(lp[1][0][1] == lp[0] for lp in lps), lps
    biased = [t for ch in c.generate(tokens=prompt, max_tokens=2, ignore_eos=True, logit_bias={ref[0]: -100.0})
              for t in ch.tokens]
    assert biased[0] != ref[0], biased
    c.complete(tokens=prompt, max_tokens=4, ignore_eos=True, repeat_penalty=1.3, repeat_last_n=-1,
               frequency_penalty=0.5, presence_penalty=0.5)
    try:
        c.complete(tokens=prompt, max_tokens=2, frequency_penalty=3.0)
        raise AssertionError("frequency_penalty 3 accepted")
    except ds4.ServerError as e:
        assert "frequency_penalty" in str(e), e

    # text prompts stream the same tokens as the engine given the tokenized text
    assert c.complete("def f(x):", max_tokens=8, ignore_eos=True) == m.detokenize(ref)

    # leaving the loop early cancels the request; the connection keeps working
    g = c.generate(tokens=prompt, max_tokens=100000, ignore_eos=True)
    first = next(iter(g))
    assert first.tokens
    g.close()
    assert g.done.reason in ("cancelled", "context"), g.done
    # constrained decoding: one JSON object, whatever the (random) model would write
    import json
    for seed in (1, 2, 3):
        text = c.complete("x", max_tokens=24, temperature=1.0, seed=seed, json_object=True)
        assert isinstance(json.loads(text), dict), text
    st = c.stats()
    assert st.requests_total >= 3 and st.tokens_out >= 16, st
    # the figures beyond ds4c_stats (ds4c_stats_ex): batching and the session-cache budget
    assert st.steps > 0 and st.step_rows >= st.steps and st.max_batch >= 1, st
    assert st.kv_budget > 0 and st.kv_in_use <= st.kv_budget and st.device == "cpu", st

    # persistent named sessions
    sid = c.open_session("py-session")
    c.complete(tokens=prompt, session=sid, max_tokens=4, ignore_eos=True)
    assert c.save_session("py-session") == len(prompt) + 4
    names = {x.name: x for x in c.sessions()}
    assert "py-session" in names and names["py-session"].n_tokens == len(prompt) + 4, names
    c.close_session(sid)
    c.delete_session("py-session")
    assert "py-session" not in {x.name for x in c.sessions()}
    try:
        c.load_session("py-session")
        raise AssertionError("a deleted session loaded")
    except ds4.ServerError as e:
        assert e.server_code == 6, e  # UnknownSession

s.close()
m.close()
print("python api ok")
