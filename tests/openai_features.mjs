// A manual check (not run by ctest: it needs the `openai` npm package) of issue 38's server
// features through the official OpenAI Node client, against any model (a random-weight one
// too): logprobs (non-streamed and streamed), json_schema output (it parses and follows the
// schema), logit_bias, an unsupported field (a 400 naming it), embeddings (base64, float,
// dimensions, several inputs), and, last, shutdown: a stream
// running when the server gets SIGTERM ends with the server's error, which the SDK throws.
//
//   cd /some/scratch && npm install openai
//   build/anvil serve -m ../shared/testdata/reference/qwen3-small --port 8080 --backend cpu -t 2 &
//   NODE_PATH=/some/scratch/node_modules node tests/openai_features.mjs http://127.0.0.1:8080/v1 $!
import { createRequire } from 'node:module';
const require = createRequire(process.env.NODE_PATH ? process.env.NODE_PATH + '/' : import.meta.url);
const OpenAI = require('openai').default ?? require('openai');

const [baseURL = 'http://127.0.0.1:8080/v1', serverPid] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.ANVIL_API_KEY ?? 'none', maxRetries: 0 });
const model = (await client.models.list()).data[0].id;
const fail = (what) => { console.error('FAIL: ' + what); process.exit(1); };
const messages = [{ role: 'user', content: 'Describe a person.' }];

// logprobs
const lp = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3,
});
const entries = lp.choices[0].logprobs?.content ?? [];
if (entries.length !== lp.usage.completion_tokens) fail(`${entries.length} logprobs entries`);
for (const e of entries) {
  if (!(e.logprob <= 0) || e.top_logprobs.length !== 3 || e.top_logprobs[0].logprob !== e.logprob)
    fail('logprobs entry ' + JSON.stringify(e));
}
console.log(`logprobs: ${entries.length} tokens, first ${JSON.stringify(entries[0].token)} ` +
            `${entries[0].logprob.toFixed(4)}`);
let streamed = 0;
const st = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3, stream: true,
});
for await (const chunk of st) streamed += chunk.choices[0]?.logprobs?.content?.length ?? 0;
if (streamed !== entries.length) fail(`streamed ${streamed} logprobs entries, not ${entries.length}`);
console.log(`logprobs streamed: ${streamed} tokens`);

// json_schema
const schema = {
  type: 'object', additionalProperties: false, required: ['name', 'age', 'colour', 'tags'],
  properties: {
    name: { type: 'string' }, age: { type: 'integer' },
    colour: { enum: ['red', 'green', 'blue'] },
    tags: { type: 'array', items: { type: 'string' }, maxItems: 3 },
  },
};
for (const [seed, max_tokens] of [[1, 44], [2, 120], [3, 300]]) {
  const r = await client.chat.completions.create({
    model, messages, max_tokens, seed, temperature: 1,
    response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } },
  });
  const text = r.choices[0].message.content;
  let doc;
  try { doc = JSON.parse(text); } catch (e) { fail(`not JSON (${max_tokens} tokens): ${text}`); }
  if (typeof doc.name !== 'string' || !Number.isInteger(doc.age) ||
      !['red', 'green', 'blue'].includes(doc.colour) || !Array.isArray(doc.tags) || doc.tags.length > 3 ||
      Object.keys(doc).some((k) => !(k in schema.properties)))
    fail('does not follow the schema: ' + text);
  console.log(`json_schema (${max_tokens} tokens, ${r.choices[0].finish_reason}): ` +
              JSON.stringify(doc).slice(0, 100));
}

// logit_bias: +100 on the first token of the greedy answer's second token's text
const ids = await fetch(baseURL.replace(/\/v1$/, '') + '/tokenize', {
  method: 'POST', body: JSON.stringify({ content: ' Paris', with_pieces: true }),
  headers: { Authorization: `Bearer ${process.env.ANVIL_API_KEY ?? 'none'}` },
}).then((r) => r.json());
const paris = ids.tokens[0];
const biased = await client.completions.create({
  model, prompt: 'The capital of France is', max_tokens: 3, temperature: 0,
  logit_bias: { [paris.id]: 100 },
});
if (biased.choices[0].text !== paris.piece.repeat(3)) fail('logit_bias: ' + biased.choices[0].text);
console.log(`logit_bias: ${JSON.stringify(biased.choices[0].text)}`);

// an unsupported field: a 400 that names it
try {
  await client.chat.completions.create({ model, messages, max_tokens: 2, service_tier: 'flex' });
  fail('service_tier accepted');
} catch (e) {
  if (e.status !== 400 || e.param !== 'service_tier') fail('unsupported field: ' + e);
  console.log(`unsupported field: ${e.status} param=${e.param}`);
}

// embeddings: the client asks for base64 unless told otherwise and decodes it; float the same,
// unit norm, dimensions cut (and normalised again), several inputs in one request
const norm = (v) => Math.sqrt(v.reduce((a, x) => a + x * x, 0));
const e64 = await client.embeddings.create({ model, input: ['Describe a person.', 'Paris'] });
const ef = await client.embeddings.create({ model, input: 'Describe a person.', encoding_format: 'float' });
const e8 = await client.embeddings.create({ model, input: 'Describe a person.', dimensions: 8 });
const a = e64.data[0].embedding, b = ef.data[0].embedding, c = e8.data[0].embedding;
if (e64.data.length !== 2 || a.length !== b.length || Math.abs(norm(a) - 1) > 1e-5) fail('embeddings: ' + a.length);
if (a.some((x, i) => Math.abs(x - b[i]) > 1e-6)) fail('embeddings: base64 and float differ');
const n8 = norm(b.slice(0, 8));
if (c.length !== 8 || c.some((x, i) => Math.abs(x - b[i] / n8) > 1e-5)) fail('embeddings: dimensions');
console.log(`embeddings: ${e64.data.length} of ${a.length} dims (base64), float the same, ` +
            `dimensions 8 = the first 8 normalised; usage ${JSON.stringify(e64.usage)}`);

// shutdown: SIGTERM while a stream runs; the stream ends with the server's error
if (serverPid) {
  const long = await client.completions.create({
    model, prompt: 'Once', max_tokens: 4000, temperature: 0, stream: true,
  });
  let n = 0;
  try {
    for await (const chunk of long) {
      if (++n === 20) process.kill(Number(serverPid), 'SIGTERM');
    }
    fail('the stream ended without an error');
  } catch (e) {
    if (!String(e.message).includes('shutting down')) fail('shutdown: ' + e);
    console.log(`shutdown: the stream ended after ${n} chunks with "${e.message}"`);
  }
}
console.log('OK');
