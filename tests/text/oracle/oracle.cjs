// The JavaScript oracle of tests/text: transformers.js (@lenml/tokenizers) encodes and decodes a
// corpus with the real Qwen3, Qwen2.5, Llama 3.1, Llama 3.2 and Gemma 3 tokenizers, and @huggingface/jinja renders
// conversations with each model's own chat template. Writes one JSON file per model, which
// test_text_oracle compares with tightfit's tokenizer and chat formats.
//
// usage: node oracle.cjs NODE_MODULES CORPUS_JSONL CHATS_JSON OUT_DIR [FILE...]
//   CORPUS_JSONL: lines {"text": "..."} or {"hex": "..."} (raw bytes, possibly invalid UTF-8)
//   FILE...: more documents, each file whole (its bytes)
// and 460 documents generated from a fixed seed (generatedDocuments, below).
// Bytes become text through TextDecoder (WHATWG: invalid UTF-8 -> U+FFFD, a BOM kept).
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

const [nodeModules, corpusPath, chatsPath, outDir, ...files] = process.argv.slice(2);
if (!outDir) {
  console.error('usage: node oracle.cjs NODE_MODULES CORPUS_JSONL CHATS_JSON OUT_DIR [FILE...]');
  process.exit(2);
}
const req = createRequire(path.join(path.resolve(nodeModules), 'x.js'));
const { TokenizerLoader } = req('@lenml/tokenizers');
const { Template } = req('@huggingface/jinja');

const decoder = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });
const docs = [];
for (const line of fs.readFileSync(corpusPath, 'utf8').split('\n')) {
  if (!line.trim()) continue;
  const d = JSON.parse(line);
  docs.push(d.hex !== undefined ? Buffer.from(d.hex, 'hex') : Buffer.from(d.text, 'utf8'));
}
for (const f of files) docs.push(fs.readFileSync(f));
docs.push(...generatedDocuments(400, 60));

/// Random documents from a fixed seed (mulberry32): characters drawn from scripts, spaces,
/// digits, combining marks, emoji and special-token strings, assigned no later than Unicode 14
/// (what PCRE2 10.42 knows, docs/data.md); then random bytes (mostly invalid UTF-8).
function generatedDocuments(textCount, byteCount) {
  let seed = 0x7451f17;
  const random = () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const pick = (a) => a[Math.floor(random() * a.length)];
  const range = (a, b) => () => String.fromCodePoint(a + Math.floor(random() * (b - a + 1)));
  const pools = [
    range(0x61, 0x7a), range(0x41, 0x5a), range(0x30, 0x39), range(0x21, 0x2f), range(0x3a, 0x40),
    () => pick([' ', ' ', ' ', '  ', '\n', '\n\n', '\t', '\r\n', '   \n']),
    range(0xa0, 0xff), range(0x100, 0x17f), range(0x300, 0x36f), range(0x391, 0x3c9),
    range(0x410, 0x44f), range(0x5d0, 0x5ea), range(0x621, 0x64a), range(0x660, 0x669),
    range(0x905, 0x939), range(0x93e, 0x94d), range(0x966, 0x96f), range(0xe01, 0xe3a),
    range(0x1100, 0x1112), range(0x1161, 0x1175), range(0x11a8, 0x11c2), range(0xac00, 0xd7a3),
    range(0x3041, 0x3096), range(0x30a1, 0x30fa), range(0x4e00, 0x9fff), range(0xff01, 0xff5e),
    range(0x1f300, 0x1f5ff), range(0x1f600, 0x1f64f), range(0x1f3fb, 0x1f3ff),
    () => pick(['\u200d', '\ufe0f', '\u00a0', '\u2003', '\u3000', '\ufeff', '\u0085', '\u2028',
                '\u200b', '\u017f', '\u212a', '\u2126']),
    () => pick(['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<|begin_of_text|>', '<|eot_id|>',
                '<bos>', '<eos>', '<start_of_turn>', '<end_of_turn>', '<think>', '</think>',
                '<table>', '<unused7>', "'s", "'LL", "'re", '<|im_sta', '▁', '▁▁']),
    () => pick(['the', ' the', 'tokenizer', ' function', 'return', '    ', 'café', 'naïve',
                '東京', '안녕', 'привет', '12345', '3.14', 'x++', '=>', '...']),
  ];
  const out = [];
  for (let d = 0; d < textCount; ++d) {
    const mode = d % 4;  // 0: one script at a time in runs, 1-3: any mix
    let s = '';
    const n = 1 + Math.floor(random() * (d % 10 === 0 ? 2000 : 120));
    let pool = pick(pools);
    for (let k = 0; k < n; ++k) {
      if (mode !== 0 || random() < 0.1) pool = pick(pools);
      s += pool();
    }
    out.push(Buffer.from(s, 'utf8'));
  }
  for (let d = 0; d < byteCount; ++d) {
    const n = 1 + Math.floor(random() * 64);
    const b = Buffer.alloc(n);
    for (let k = 0; k < n; ++k)
      b[k] = random() < 0.5 ? 0x61 + Math.floor(random() * 26) : Math.floor(random() * 256);
    out.push(b);
  }
  return out;
}

const chats = JSON.parse(fs.readFileSync(chatsPath, 'utf8'));
const hex = (s) => Buffer.from(s, 'utf8').toString('hex');

fs.mkdirSync(outDir, { recursive: true });
for (const model of ['qwen3', 'qwen2_5', 'llama3_1', 'llama3_2', 'gemma3']) {
  const dir = path.join(path.resolve(nodeModules), '@lenml', 'tokenizer-' + model, 'models');
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
  const tokenizerConfig = JSON.parse(
    fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  const out = { model, dir, documents: [], chats: [] };
  for (const bytes of docs) {
    const text = decoder.decode(bytes);
    const ids = tok.encode(text, { add_special_tokens: false });
    const withSpecial = tok.encode(text, { add_special_tokens: true });
    const decoded = ids.length ? tok.decode(ids, { clean_up_tokenization_spaces: false }) : '';
    const skipped = withSpecial.length
      ? tok.decode(withSpecial, { skip_special_tokens: true, clean_up_tokenization_spaces: false })
      : '';
    out.documents.push({
      bytes: bytes.toString('hex'), ids, ids_special: withSpecial, decoded: hex(decoded),
      decoded_skip_special: hex(skipped),
    });
  }
  const template = new Template(tokenizerConfig.chat_template);
  const render = (messages, add_generation_prompt) => template.render({
    messages, add_generation_prompt, bos_token: tokenizerConfig.bos_token,
    eos_token: tokenizerConfig.eos_token, date_string: '26 Jul 2024',  // Llama 3.2's system header
  });
  for (const chat of chats) {
    const entry = { name: chat.name, rendered: null, rendered_generation: null };
    try {
      entry.rendered = render(chat.messages, false);
      entry.rendered_generation = render(chat.messages, true);
    } catch (e) {
      entry.error = String(e.message || e);
      out.chats.push(entry);
      continue;
    }
    entry.ids = tok.encode(entry.rendered, { add_special_tokens: false });
    // the prompt of the last assistant turn: everything before it, with the generation prompt
    const last = chat.messages.length - 1;
    if (chat.messages[last].role === 'assistant') {
      const prompt = render(chat.messages.slice(0, last), true);
      entry.prompt_ids = tok.encode(prompt, { add_special_tokens: false });
    }
    out.chats.push(entry);
  }
  fs.writeFileSync(path.join(outDir, model + '.json'), JSON.stringify(out));
  console.log(`${model}: ${docs.length} documents, ${chats.length} conversations`);
}
