// The JavaScript oracle of tests/text: transformers.js (@lenml/tokenizers) encodes and decodes a
// corpus with the real Qwen3, Llama 3.1 and Gemma 3 tokenizers, and @huggingface/jinja renders
// conversations with each model's own chat template. Writes one JSON file per model, which
// test_text_oracle compares with tightfit's tokenizer and chat formats.
//
// usage: node oracle.cjs NODE_MODULES CORPUS_JSONL CHATS_JSON OUT_DIR [FILE...]
//   CORPUS_JSONL: lines {"text": "..."} or {"hex": "..."} (raw bytes, possibly invalid UTF-8)
//   FILE...: more documents, each file whole (its bytes)
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

const chats = JSON.parse(fs.readFileSync(chatsPath, 'utf8'));
const hex = (s) => Buffer.from(s, 'utf8').toString('hex');

fs.mkdirSync(outDir, { recursive: true });
for (const model of ['qwen3', 'llama3_1', 'gemma3']) {
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
    eos_token: tokenizerConfig.eos_token,
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
