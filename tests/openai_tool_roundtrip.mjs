// A manual check (not run by ctest: it needs the `openai` npm package): tool calls through
// `anvil serve` with the official OpenAI Node client, non-streamed and streamed (the SDK's own
// stream accumulator), then the call and its result sent back for the next turn.
//
//   cd /some/scratch && npm install openai
//   ANVIL_SCRIPTED_MODELS=/some/scratch/models build/toolcall_serve_test   # writes two models
//   build/anvil serve -m /some/scratch/models/qwen3-json --port 8080 --backend cpu &
//   NODE_PATH=/some/scratch/node_modules node tests/openai_tool_roundtrip.mjs http://127.0.0.1:8080/v1 auto
//   (the Qwen3.5 template's XML format: serve models/qwen35-xml and pass "named")
//
// The scripted models (tests/toolcall_serve_test.c) really generate
// get_weather(city="Paris"): qwen3-json on any prompt ending in "\n" (tool_choice auto),
// qwen35-xml once the prompt is forced to "<function=get_weather>\n" (tool_choice naming it).
import { createRequire } from 'node:module';
const require = createRequire(process.env.NODE_PATH ? process.env.NODE_PATH + '/' : import.meta.url);
const OpenAI = require('openai').default ?? require('openai');

const [baseURL = 'http://127.0.0.1:8080/v1', mode = 'auto'] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.ANVIL_API_KEY ?? 'none' });
const model = (await client.models.list()).data[0].id;
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];
const tool_choice = mode === 'named' ? { type: 'function', function: { name: 'get_weather' } } : 'auto';
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const fail = (what) => { console.error('FAIL: ' + what); process.exit(1); };

function check(message, finish, how) {
  const calls = message.tool_calls ?? [];
  if (finish !== 'tool_calls') fail(`${how}: finish_reason ${finish}`);
  if (calls.length !== 1) fail(`${how}: ${calls.length} tool calls`);
  const c = calls[0];
  const args = JSON.parse(c.function.arguments);
  if (c.type !== 'function' || c.function.name !== 'get_weather' || args.city !== 'Paris' || !c.id)
    fail(`${how}: ${JSON.stringify(c)}`);
  console.log(`${how}: ${c.id} ${c.function.name}(${c.function.arguments}), content ${JSON.stringify(message.content)}`);
}

const r = await client.chat.completions.create({ model, messages, tools, tool_choice, temperature: 0, max_tokens: 64 });
check(r.choices[0].message, r.choices[0].finish_reason, 'non-streamed');

const stream = client.chat.completions.stream({ model, messages, tools, tool_choice, temperature: 0, max_tokens: 64 });
let chunks = 0;
for await (const _ of stream) chunks++;
const final = await stream.finalChatCompletion();
check(final.choices[0].message, final.choices[0].finish_reason, `streamed (${chunks} chunks)`);

const call = r.choices[0].message.tool_calls[0];
const next = await client.chat.completions.create({
  model, tools, temperature: 0, max_tokens: 64,
  messages: [...messages, { role: 'assistant', content: null, tool_calls: [call] },
             { role: 'tool', tool_call_id: call.id, content: '22 C, sunny' }],
});
console.log(`next turn (call and result sent back): ${next.choices[0].finish_reason}, ` +
            `${next.usage.prompt_tokens} prompt tokens`);
console.log('OK');
