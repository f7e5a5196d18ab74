#!/usr/bin/env node
// HF tokenizers as a local oracle, through its Node bindings (npm package `tokenizers`,
// same Rust core as the Python package; install it outside the repository:
//   npm install --prefix /tmp/hf tokenizers   and run with NODE_PATH=/tmp/hf/node_modules).
//
//   node hf_oracle.js encode TOKENIZER_JSON TEXTS_JSON > IDS_JSON
//       TEXTS_JSON: ["text", ...] -> [{"plain": [...], "special": [...]}, ...]
//       plain = special tokens are ordinary text (the added tokens are left out).
//   node hf_oracle.js categories > hf_categories.json
//       code points HF's regex engine matches with \p{L} \p{M} \p{N} \p{P} \p{S} \s.
const fs = require('fs');
const tk = require('tokenizers');

async function encode(tokPath, textsPath) {
  const json = fs.readFileSync(tokPath, 'utf8');
  const withSpecials = tk.Tokenizer.fromString(json);
  const bareDoc = JSON.parse(json);
  bareDoc.added_tokens = [];
  const bare = tk.Tokenizer.fromString(JSON.stringify(bareDoc));
  const texts = JSON.parse(fs.readFileSync(textsPath, 'utf8'));
  const out = [];
  for (const t of texts) {
    const plain = (await bare.encode(t, null, { addSpecialTokens: false })).getIds();
    const special = (await withSpecials.encode(t, null, { addSpecialTokens: false })).getIds();
    out.push({ plain, special });
  }
  process.stdout.write(JSON.stringify(out));
}

function categories() {
  const mk = (re) => tk.Tokenizer.fromString(JSON.stringify({
    version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: { type: 'Split', pattern: { Regex: re }, behavior: 'Removed', invert: false },
    post_processor: null, decoder: null,
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: { a: 0 }, merges: [] },
  })).getPreTokenizer();
  const cps = [];
  for (let c = 0; c <= 0x10FFFF; c++) if (c < 0xD800 || c > 0xDFFF) cps.push(c);
  const parts = [];
  for (let i = 0; i < cps.length; i += 10000) parts.push(String.fromCodePoint(...cps.slice(i, i + 10000)));
  const text = parts.join('');
  const out = {};
  for (const [name, re] of [['L', '\\p{L}'], ['M', '\\p{M}'], ['N', '\\p{N}'], ['P', '\\p{P}'], ['S', '\\p{S}'], ['WS', '\\s']]) {
    const matched = new Uint8Array(cps.length).fill(1);
    for (const [, [a, b]] of mk(re).preTokenizeString(text)) matched.fill(0, a, b);  // char offsets of the gaps
    const ranges = [];
    let start = -1;
    for (let i = 0; i <= cps.length; i++) {
      const m = i < cps.length && matched[i];
      if (m && start < 0) start = i;
      if (!m && start >= 0) { ranges.push([cps[start], cps[i - 1]]); start = -1; }
    }
    out[name] = ranges;
  }
  process.stdout.write(JSON.stringify(out));
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === 'encode' && args.length === 2) encode(args[0], args[1]);
else if (cmd === 'categories') categories();
else { process.stderr.write('usage: hf_oracle.js encode TOKENIZER_JSON TEXTS_JSON | categories\n'); process.exit(2); }
