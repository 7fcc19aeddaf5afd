// Drives a running `keel serve` with the unmodified openai npm package:
// models, completions, chat completions, streaming, log-probs, stop strings
// and errors, as any OpenAI client would use them. run.sh starts the server
// and runs this; by hand:
//
//   KEEL_URL=http://127.0.0.1:30000 KEEL_API_KEY=... node check.mjs
//
// KEEL_MODEL names the served model (default tiny-moe-base). One line per
// check passed; the first failure is printed and exits non-zero.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

const url = process.env.KEEL_URL;
const apiKey = process.env.KEEL_API_KEY;
const model = process.env.KEEL_MODEL || 'tiny-moe-base';
if (!url || !apiKey) {
  console.error('openai-check: set KEEL_URL (e.g. http://127.0.0.1:30000) and KEEL_API_KEY');
  process.exit(2);
}

// No retries: a flaky answer must fail the check, not be papered over.
const clientOpts = { baseURL: url.replace(/\/+$/, '') + '/v1', maxRetries: 0, timeout: 30_000 };
const client = new OpenAI({ ...clientOpts, apiKey });
const sdkVersion = JSON.parse(readFileSync(new URL('./node_modules/openai/package.json', import.meta.url))).version;

// The whole check must be quick; a hung server fails it.
setTimeout(() => {
  console.error('openai-check: FAIL: still running after 90 s');
  process.exit(1);
}, 90_000).unref();

class CheckError extends Error {}

function assert(cond, msg, got) {
  if (!cond) {
    throw new CheckError(got === undefined ? msg : `${msg}; got ${JSON.stringify(got)}`);
  }
}

function assertEq(got, want, msg) {
  assert(JSON.stringify(got) === JSON.stringify(want), `${msg}: want ${JSON.stringify(want)}`, got);
}

let passed = 0;
async function check(name, fn) {
  try {
    const detail = await fn();
    passed++;
    console.log(`ok   ${name}${detail ? ` (${detail})` : ''}`);
  } catch (err) {
    console.error(`FAIL ${name}: ${err instanceof CheckError ? err.message : err?.stack || err}`);
    process.exit(1);
  }
}

// expectError awaits a request that must reject with the SDK's class cls
// and the given status; it returns the error.
async function expectError(promise, cls, status) {
  let res;
  try {
    res = await promise;
  } catch (err) {
    assert(err instanceof cls, `want OpenAI.${cls.name} (${status}), got ${err?.constructor?.name}: ${err?.message}`);
    assertEq(err.status, status, 'error status');
    assert(typeof err.message === 'string' && err.message.length > 0, 'error without a message');
    return err;
  }
  throw new CheckError(`want OpenAI.${cls.name} (${status}), the request succeeded: ${JSON.stringify(res).slice(0, 300)}`);
}

const prompt = '<|im_start|>user\nCompute 446+5.<|im_end|>\n<|im_start|>assistant\n';
const question = [{ role: 'user', content: 'Compute 446+5.' }];

// checkCompletionLogprobs checks a completion choice's logprobs against its
// text: as many tokens as log-probs, top alternatives and offsets, k
// alternatives each, and the tokens spelling the text.
function checkCompletionLogprobs(c, k) {
  const lp = c.logprobs;
  assert(lp && Array.isArray(lp.tokens) && Array.isArray(lp.token_logprobs), `choice ${c.index}: logprobs.tokens/token_logprobs missing`, lp);
  const n = lp.tokens.length;
  assert(n > 0, `choice ${c.index}: no logprobs tokens`);
  assertEq(lp.token_logprobs.length, n, `choice ${c.index}: token_logprobs length`);
  assertEq(lp.top_logprobs?.length, n, `choice ${c.index}: top_logprobs length`);
  assertEq(lp.text_offset?.length, n, `choice ${c.index}: text_offset length`);
  assertEq(lp.tokens.join(''), c.text, `choice ${c.index}: logprobs tokens joined`);
  lp.token_logprobs.forEach((x, t) => assert(typeof x === 'number' && x <= 0, `choice ${c.index}: token_logprobs[${t}] not a log-probability`, x));
  lp.top_logprobs.forEach((m, t) => {
    assertEq(Object.keys(m ?? {}).length, k, `choice ${c.index}: top_logprobs[${t}] alternatives`);
    Object.values(m).forEach((x) => assert(typeof x === 'number' && x <= 0, `choice ${c.index}: top_logprobs[${t}] value`, m));
  });
}

// collect reads a completion stream into per-choice text, tokens and finish
// reasons.
async function collectCompletions(stream) {
  const out = new Map();
  let usage = null;
  for await (const chunk of stream) {
    assertEq(chunk.object, 'text_completion', 'chunk object');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const o = out.get(c.index) ?? { text: '', tokens: [], finish: null };
      o.text += c.text ?? '';
      if (c.logprobs) {
        assertEq(c.logprobs.tokens.length, c.logprobs.token_logprobs.length, 'streamed logprobs lengths');
        o.tokens.push(...c.logprobs.tokens);
      }
      if (c.finish_reason) {
        assert(o.finish === null, `choice ${c.index}: two finish reasons`);
        o.finish = c.finish_reason;
      }
      out.set(c.index, o);
    }
  }
  return { choices: out, usage };
}

async function collectChat(stream) {
  const out = new Map();
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assertEq(chunk.object, 'chat.completion.chunk', 'chunk object');
    if (chunk.usage) {
      assertEq(chunk.choices, [], 'the usage chunk\'s choices');
      usage = chunk.usage;
    }
    for (const c of chunk.choices) {
      const o = out.get(c.index) ?? { role: null, content: '', tokens: [], finish: null };
      if (c.delta?.role) o.role = c.delta.role;
      o.content += c.delta?.content ?? '';
      for (const e of c.logprobs?.content ?? []) o.tokens.push(e.token);
      if (c.finish_reason) {
        assert(o.finish === null, `choice ${c.index}: two finish reasons`);
        o.finish = c.finish_reason;
      }
      out.set(c.index, o);
    }
  }
  return { choices: out, usage, chunks };
}

const finishes = ['stop', 'length'];

console.log(`openai-check: openai ${sdkVersion} on Node ${process.version} against ${clientOpts.baseURL}`);

await check('models.list lists the served model', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert(ids.includes(model), `model ${model} not listed`, ids);
  return ids.join(', ');
});

const cmplReq = { model, prompt, max_tokens: 48, seed: 1234, n: 2, logprobs: 2 };
let cmpl;
await check('completions.create: n=2, logprobs=2, finish_reason, usage', async () => {
  cmpl = await client.completions.create(cmplReq);
  assertEq(cmpl.object, 'text_completion', 'object');
  assertEq(cmpl.model, model, 'model');
  assert(typeof cmpl.id === 'string' && cmpl.id.length > 0, 'id missing');
  assertEq(cmpl.choices.map((c) => c.index), [0, 1], 'choice indices');
  for (const c of cmpl.choices) {
    assert(finishes.includes(c.finish_reason), `choice ${c.index}: finish_reason`, c.finish_reason);
    assert(c.text.length > 0, `choice ${c.index}: empty text`);
    checkCompletionLogprobs(c, 2);
  }
  const u = cmpl.usage;
  assert(u && u.prompt_tokens > 0 && u.completion_tokens > 0 && u.total_tokens === u.prompt_tokens + u.completion_tokens, 'usage', u);
  return cmpl.choices.map((c) => JSON.stringify(c.text)).join(', ');
});

await check('completions.create: the same seed gives the same text', async () => {
  const again = await client.completions.create(cmplReq);
  assertEq(again.choices.map((c) => c.text), cmpl.choices.map((c) => c.text), 'texts of a second request with seed 1234');
  assertEq(again.choices.map((c) => c.logprobs.tokens), cmpl.choices.map((c) => c.logprobs.tokens), 'tokens of a second request');
});

await check('completions.create stream: deltas concatenate to the non-streamed text', async () => {
  const { choices, usage } = await collectCompletions(await client.completions.create({ ...cmplReq, stream: true, stream_options: { include_usage: true } }));
  assertEq([...choices.keys()].sort(), [0, 1], 'streamed choice indices');
  for (const c of cmpl.choices) {
    const s = choices.get(c.index);
    assertEq(s.text, c.text, `choice ${c.index}: streamed text`);
    assertEq(s.tokens, c.logprobs.tokens, `choice ${c.index}: streamed logprobs tokens`);
    assertEq(s.finish, c.finish_reason, `choice ${c.index}: streamed finish_reason`);
  }
  assertEq(usage, cmpl.usage, 'streamed usage');
});

const chatReq = { model, messages: question, seed: 99, max_tokens: 64, logprobs: true, top_logprobs: 3 };
let chat;
await check('chat.completions.create: assistant message, logprobs with 3 top_logprobs', async () => {
  chat = await client.chat.completions.create(chatReq);
  assertEq(chat.object, 'chat.completion', 'object');
  assertEq(chat.choices.length, 1, 'choices');
  const c = chat.choices[0];
  assertEq(c.message.role, 'assistant', 'role');
  assert(typeof c.message.content === 'string' && c.message.content.length > 0, 'empty content', c.message);
  assert(finishes.includes(c.finish_reason), 'finish_reason', c.finish_reason);
  const content = c.logprobs?.content;
  assert(Array.isArray(content) && content.length > 0, 'logprobs.content missing', c.logprobs);
  assertEq(content.map((e) => e.token).join(''), c.message.content, 'logprobs tokens joined');
  content.forEach((e, t) => {
    assert(typeof e.logprob === 'number' && e.logprob <= 0, `content[${t}].logprob`, e);
    assertEq(e.top_logprobs?.length, 3, `content[${t}].top_logprobs entries`);
    e.top_logprobs.forEach((a) => assert(typeof a.token === 'string' && typeof a.logprob === 'number' && Array.isArray(a.bytes), `content[${t}] alternative`, a));
  });
  return JSON.stringify(c.message.content);
});

await check('chat.completions.create: greedy answer of "Compute 446+5."', async () => {
  const r = await client.chat.completions.create({ model, messages: question, temperature: 0, max_tokens: 64 });
  const text = r.choices[0].message.content;
  assert(/Answer: 451\b/.test(text), 'want "Answer: 451" in the content', text);
  return JSON.stringify(text);
});

await check('chat.completions.create stream: deltas concatenate, usage chunk', async () => {
  const { choices, usage, chunks } = await collectChat(await client.chat.completions.create({ ...chatReq, stream: true, stream_options: { include_usage: true } }));
  assertEq([...choices.keys()], [0], 'streamed choice indices');
  const s = choices.get(0);
  const c = chat.choices[0];
  assertEq(s.role, 'assistant', 'streamed role');
  assertEq(s.content, c.message.content, 'streamed content');
  assertEq(s.tokens, c.logprobs.content.map((e) => e.token), 'streamed logprobs tokens');
  assertEq(s.finish, c.finish_reason, 'streamed finish_reason');
  assert(usage !== null, 'no usage chunk with stream_options.include_usage');
  assertEq(usage, chat.usage, 'streamed usage');
  return `${chunks} chunks`;
});

await check('stop: a stop string cuts the text before it (plain and streamed, with logprobs)', async () => {
  const base = { model, prompt, max_tokens: 48, seed: 5, logprobs: 1 };
  const full = (await client.completions.create(base)).choices[0].text;
  const at = full.indexOf('=') >= 0 ? full.indexOf('=') : Math.floor(full.length / 2);
  assert(at > 0, 'text too short to cut', full);
  const stop = full.slice(at, at + 2);
  const want = full.slice(0, full.indexOf(stop));
  const r = await client.completions.create({ ...base, stop: [stop] });
  assertEq(r.choices[0].text, want, `text with stop ${JSON.stringify(stop)}`);
  assertEq(r.choices[0].finish_reason, 'stop', 'finish_reason');
  checkCompletionLogprobs(r.choices[0], 1);
  const { choices } = await collectCompletions(await client.completions.create({ ...base, stop, stream: true }));
  assertEq(choices.get(0).text, want, 'streamed text with stop');
  assertEq(choices.get(0).tokens, r.choices[0].logprobs.tokens, 'streamed logprobs tokens with stop');
  assertEq(choices.get(0).finish, 'stop', 'streamed finish_reason with stop');
  const ch = await client.chat.completions.create({ model, messages: question, temperature: 0, max_tokens: 64, stop: ':' });
  assertEq(ch.choices[0].message.content, 'Answer', 'chat content with stop ":"');
  return `${JSON.stringify(full)} stopped at ${JSON.stringify(stop)}`;
});

await check('echo: the prompt comes once before the completion (plain and streamed)', async () => {
  const base = { model, prompt: 'Compute 4', max_tokens: 8, temperature: 0, echo: true, stop: 'd-x' };
  const r = await client.completions.create(base);
  const text = r.choices[0].text;
  assert(text.startsWith('Compute 4') && text.length > 'Compute 4'.length, 'echoed text', text);
  const { choices } = await collectCompletions(await client.completions.create({ ...base, stream: true }));
  assertEq(choices.get(0).text, text, 'streamed echoed text');
  return JSON.stringify(text);
});

await check('a stream the client abandons does not disturb the server', async () => {
  const stream = await client.completions.create({ model, prompt, max_tokens: 300, seed: 3, stream: true });
  for await (const chunk of stream) {
    assert(chunk.choices.length > 0, 'first chunk without choices');
    break; // the SDK aborts the request
  }
  const again = await client.completions.create({ ...cmplReq });
  assertEq(again.choices.map((c) => c.text), cmpl.choices.map((c) => c.text), 'texts after an abandoned stream');
});

await check('errors: an unknown model is OpenAI.NotFoundError (404)', async () => {
  await expectError(client.completions.create({ ...cmplReq, model: 'no-such-model' }), OpenAI.NotFoundError, 404);
  const err = await expectError(client.chat.completions.create({ model: 'no-such-model', messages: question }), OpenAI.NotFoundError, 404);
  return err.message;
});

await check('errors: temperature -1 is OpenAI.BadRequestError (400) naming the field', async () => {
  const err = await expectError(client.chat.completions.create({ model, messages: question, temperature: -1 }), OpenAI.BadRequestError, 400);
  assert(err.message.includes('temperature'), 'the message does not name temperature', err.message);
  assertEq(err.param, 'temperature', 'error param');
  const s = await expectError(client.chat.completions.create({ model, messages: question, temperature: -1, stream: true }), OpenAI.BadRequestError, 400);
  assert(s.message.includes('temperature'), 'streamed: the message does not name temperature', s.message);
  return err.message;
});

await check('errors: max_tokens beyond the context is OpenAI.BadRequestError (400) naming the field', async () => {
  const err = await expectError(client.completions.create({ model, prompt, max_tokens: 1_000_000 }), OpenAI.BadRequestError, 400);
  assert(err.message.includes('max_tokens'), 'the message does not name max_tokens', err.message);
  assertEq(err.param, 'max_tokens', 'error param');
  return err.message;
});

await check('errors: a wrong API key is OpenAI.AuthenticationError (401)', async () => {
  const bad = new OpenAI({ ...clientOpts, apiKey: apiKey + '-wrong' });
  await expectError(bad.models.list(), OpenAI.AuthenticationError, 401);
  const err = await expectError(bad.chat.completions.create({ model, messages: question }), OpenAI.AuthenticationError, 401);
  return err.message;
});

console.log(`openai-check: all ${passed} checks passed`);
