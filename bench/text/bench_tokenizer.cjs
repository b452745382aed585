// The transformers.js side of bench_tokenizer: encodes the documents of a JSON file (an array of
// strings) with @lenml/tokenizers, one warm-up pass then timed passes, single-threaded (as
// JavaScript runs), and prints {"tokens": per pass, "seconds": [each pass], "cold_seconds" (the
// warm-up pass), "load_seconds"}.
//   node bench_tokenizer.cjs NODE_MODULES MODEL DOCS_JSON PASSES
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

const [nodeModules, model, docsPath, passesText] = process.argv.slice(2);
const req = createRequire(path.join(path.resolve(nodeModules), 'x.js'));
const { TokenizerLoader } = req('@lenml/tokenizers');
const dir = path.join(path.resolve(nodeModules), '@lenml', 'tokenizer-' + model, 'models');
const t0 = process.hrtime.bigint();
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')),
});
const loadSeconds = Number(process.hrtime.bigint() - t0) / 1e9;
const docs = JSON.parse(fs.readFileSync(docsPath, 'utf8'));
const pass = () => {
  let n = 0;
  for (const d of docs) n += tok.encode(d, { add_special_tokens: false }).length;
  return n;
};
const w = process.hrtime.bigint();
const tokens = pass();  // warm-up: the word cache starts empty
const coldSeconds = Number(process.hrtime.bigint() - w) / 1e9;
const seconds = [];
for (let p = 0; p < Number(passesText); ++p) {
  const s = process.hrtime.bigint();
  if (pass() !== tokens) throw new Error('the token count changed between passes');
  seconds.push(Number(process.hrtime.bigint() - s) / 1e9);
}
console.log(JSON.stringify({ tokens, seconds, cold_seconds: coldSeconds, load_seconds: loadSeconds }));
