// openai_client.js - drives `flare run` through the official `openai` npm
// client (issue 14's acceptance; tests/test_openai_client.py runs it and
// checks every result against the same request sent raw).
//
//   node tests/openai_client.js MODULE_DIR BASE_URL API_KEY [IMAGE_URL MODEL]
//
// Prints one JSON document: for each call its name, the endpoint and the
// body sent (so the raw side can send the same), and what the client
// parsed.  A call that throws where none should ends the program with 1.
'use strict';

const [moduleDir, baseURL, apiKey] = process.argv.slice(2);
const { OpenAI } = require(moduleDir + '/node_modules/openai');

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const out = [];

function choiceOf(kind, c) {
  return {
    index: c.index,
    text: kind === 'chat' ? c.message.content : c.text,
    finish_reason: c.finish_reason,
    logprobs: c.logprobs,
  };
}

async function plain(name, kind, body) {
  const r = kind === 'chat' ? await client.chat.completions.create(body)
                            : await client.completions.create(body);
  out.push({ name, kind, body, stream: false, id: r.id, object: r.object,
             choices: r.choices.map((c) => choiceOf(kind, c)), usage: r.usage });
  return r;
}

async function streamed(name, kind, body) {
  const s = kind === 'chat' ? await client.chat.completions.create({ ...body, stream: true })
                            : await client.completions.create({ ...body, stream: true });
  const choices = new Map();
  let usage = null, chunks = 0, id = null;
  for await (const ch of s) {
    chunks++;
    id = id || ch.id;
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      const e = choices.get(c.index) || { index: c.index, text: '', finish_reason: null, tokens: 0 };
      const t = kind === 'chat' ? (c.delta && c.delta.content) || '' : c.text || '';
      e.text += t;
      if (c.logprobs) {
        e.tokens += kind === 'chat' ? c.logprobs.content.length : c.logprobs.tokens.length;
      }
      if (c.finish_reason) e.finish_reason = c.finish_reason;
      choices.set(c.index, e);
    }
  }
  out.push({ name, kind, body, stream: true, id, chunks,
             choices: [...choices.values()].sort((a, b) => a.index - b.index), usage });
}

async function failure(name, kind, body, fn) {
  try {
    await fn();
    out.push({ name, kind, body, error: null });
  } catch (e) {
    out.push({ name, kind, body, error: { status: e.status, type: e.type, code: e.code,
                                          param: e.param, message: e.message,
                                          class: e.constructor.name } });
  }
}

// With IMAGE_URL (a data: URL) and MODEL: chat calls with an image part
// against a vision core instead (issue 20), and the refusal of a URL the
// server must not fetch.
async function vision(imageURL, model) {
  const content = [{ type: 'text', text: 'What is in this picture?' },
                   { type: 'image_url', image_url: { url: imageURL, detail: 'auto' } }];
  const chat = { model, messages: [{ role: 'user', content }], temperature: 0, max_tokens: 12 };
  await plain('image chat', 'chat', chat);
  await streamed('image chat stream', 'chat', { ...chat, stream_options: { include_usage: true } });
  const bad = [{ role: 'user', content: [{ type: 'image_url',
                                           image_url: { url: 'https://example.com/a.png' } }] }];
  await failure('image https', 'chat', { model, messages: bad },
                () => client.chat.completions.create({ model, messages: bad }));
  process.stdout.write(JSON.stringify(out, null, 1) + '\n');
}

(async () => {
  if (process.argv[5]) return vision(process.argv[5], process.argv[6]);
  const msgs = [{ role: 'user', content: 'Tell me about the tides of the northern sea.' }];
  const chat = { model: 'tiny', messages: msgs, temperature: 0, max_tokens: 24 };
  const first = await plain('chat', 'chat', chat);
  await streamed('chat stream', 'chat', { ...chat, stream_options: { include_usage: true } });
  const cmpl = { model: 'tiny', prompt: 'Once upon a time', temperature: 0, max_tokens: 24 };
  await plain('completion', 'completions', cmpl);
  await streamed('completion stream', 'completions', { ...cmpl, stream_options: { include_usage: true } });

  // A stop sequence taken from the reply itself, so it must match.
  const reply = first.choices[0].message.content;
  const stop = reply.length >= 6 ? reply.slice(3, 5) : reply.slice(0, 1);
  await plain('chat stop', 'chat', { ...chat, stop: [stop, '\u00a7never\u00a7'] });
  await streamed('chat stop stream', 'chat', { ...chat, stop });
  await plain('completion stop', 'completions', { ...cmpl, stop: reply.slice(0, 1) });

  // n choices (sampled, seeded) and list prompts.
  await plain('chat n', 'chat', { ...chat, n: 3, temperature: 0.8, seed: 7, max_tokens: 10 });
  await streamed('chat n stream', 'chat', { ...chat, n: 2, temperature: 0.8, seed: 7, max_tokens: 10 });
  await plain('completion list', 'completions',
              { model: 'tiny', prompt: ['Hello', 'World', 'again'], temperature: 0, max_tokens: 6 });
  await plain('completion token lists', 'completions',
              { model: 'tiny', prompt: [[72, 105], [89, 111]], n: 2, seed: 3, max_tokens: 4 });

  // Logprobs in both shapes.
  await plain('chat logprobs', 'chat', { ...chat, logprobs: true, top_logprobs: 3, max_tokens: 6 });
  await streamed('chat logprobs stream', 'chat', { ...chat, logprobs: true, top_logprobs: 2, max_tokens: 6 });
  await plain('completion logprobs', 'completions', { ...cmpl, logprobs: 2, max_tokens: 6 });

  // Models.
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  const one = await client.models.retrieve('tiny');
  out.push({ name: 'models', ids, retrieved: { id: one.id, object: one.object, owned_by: one.owned_by } });

  // Errors the client must see as OpenAI errors.
  await failure('bad role', 'chat', { model: 'tiny', messages: [{ role: 'wizard', content: 'x' }] },
                () => client.chat.completions.create({ model: 'tiny', messages: [{ role: 'wizard', content: 'x' }] }));
  await failure('unknown model', 'models', null, () => client.models.retrieve('gpt-4o'));
  const wrong = new OpenAI({ baseURL, apiKey: apiKey + '-wrong', maxRetries: 0 });
  await failure('wrong key', 'models', null, () => wrong.models.list());

  process.stdout.write(JSON.stringify(out, null, 1) + '\n');
})().catch((e) => {
  console.error('openai client call failed:', e && e.stack ? e.stack : e);
  process.exit(1);
});
