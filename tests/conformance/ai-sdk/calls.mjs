// Vercel's AI SDK against a real shoal: generateText, streamText, generateObject and generateText's
// Output.object (a zod schema), stop sequences, tool calls (a zod input schema) and embedMany, through
// three providers: the OpenAI-compatible one (/v1/chat/completions, /v1/embeddings), Anthropic's
// (/v1/messages) and the Ollama community provider (/api/chat, /api/embed).
// Usage: `node calls.mjs <shoal url> <model id>`. Prints one JSON object per call on its own line
// ({provider, call, ...what came back} or {provider, call, error}); the assertions are test_ai_sdk.py's,
// which runs this from an install of package.json outside the repository.
import { createAnthropic } from '@ai-sdk/anthropic';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { Output, embedMany, generateObject, generateText, stepCountIs, streamText, tool } from 'ai';
import { createOllama } from 'ollama-ai-provider-v2';
import { z } from 'zod';

globalThis.AI_SDK_LOG_WARNINGS = false; // each result carries its warnings

const [url, modelId] = process.argv.slice(2);
if (!url || !modelId) {
  console.error('usage: node calls.mjs <shoal url> <model id>');
  process.exit(2);
}

const PROMPT = 'What is the capital of France?';
const TOOL_PROMPT = 'What is the weather in Paris?';
const STRUCTURED_PROMPT = 'John is 30 years old. Extract the person.';
const MAX_TOKENS = 48;

const openaiCompatible = createOpenAICompatible({
  name: 'shoal', baseURL: `${url}/v1`, apiKey: 'none', supportsStructuredOutputs: true, includeUsage: true,
});
const ollama = createOllama({ baseURL: `${url}/api` });
const providers = {
  openai_compatible: openaiCompatible.chatModel(modelId),
  anthropic: createAnthropic({ baseURL: `${url}/v1`, apiKey: 'none' })(modelId),
  ollama: ollama(modelId),
};
// Embedding models (/v1/embeddings, /api/embed); Anthropic's API has none.
const embeddingModels = {
  openai_compatible: openaiCompatible.textEmbeddingModel(modelId), ollama: ollama.embedding(modelId),
};
// Ollama's API has no way to force a call; the other two take AI SDK's toolChoice (a named tool, or
// 'required'). The calls that need a forced call are made only where it can be forced.
const forcesTools = { openai_compatible: true, anthropic: true, ollama: false };
const FORCED_ONLY = new Set(['toolsRequired', 'twoSteps']);
const STOP = 'Paris';

// The Ollama provider writes temperature and maxOutputTokens as top-level fields of /api/chat, where
// Ollama's API has none (Ollama ignores them, as shoal does), and drops stopSequences: its own options
// go in providerOptions.
function settings(provider, maxTokens = MAX_TOKENS, stop = undefined) {
  const options = { temperature: 0, num_predict: maxTokens, ...(stop ? { stop } : {}) };
  return {
    temperature: 0, maxOutputTokens: maxTokens, maxRetries: 0, ...(stop ? { stopSequences: stop } : {}),
    ...(provider === 'ollama' ? { providerOptions: { ollama: { options } } } : {}),
  };
}

function usage(u) {
  return { inputTokens: u?.inputTokens ?? null, outputTokens: u?.outputTokens ?? null };
}

const calls = {
  async generateText(model, provider) {
    const r = await generateText({ model, prompt: PROMPT, ...settings(provider) });
    return { text: r.text, finishReason: r.finishReason, usage: usage(r.usage), warnings: r.warnings };
  },
  // generateText's prompt and settings again with a stop sequence, generated and streamed.
  // The stop sequence is a word of the answer without one (its second of four letters or more), so it
  // is met whatever this CPU's greedy answer is.
  async stopSequences(model, provider) {
    const full = await generateText({ model, prompt: PROMPT, ...settings(provider) });
    const words = full.text.match(/[A-Za-z]{4,}/g) ?? [STOP];
    const stop = words[Math.min(1, words.length - 1)];
    const r = await generateText({ model, prompt: PROMPT, ...settings(provider, MAX_TOKENS, [stop]) });
    const s = streamText({ model, prompt: PROMPT, ...settings(provider, MAX_TOKENS, [stop]) });
    return {
      stop, text: r.text, finishReason: r.finishReason, rawFinishReason: r.rawFinishReason,
      streamed: await s.text, streamedFinishReason: await s.finishReason,
    };
  },
  async streamText(model, provider) {
    const r = streamText({ model, system: 'Answer in one sentence.', prompt: PROMPT, ...settings(provider) });
    const chunks = [];
    for await (const chunk of r.textStream) chunks.push(chunk);
    return {
      chunks: chunks.length, text: chunks.join(''), finishReason: await r.finishReason,
      usage: usage(await r.usage),
    };
  },
  async generateObject(model, provider, providerOptions = undefined) {
    const r = await generateObject({
      model, prompt: STRUCTURED_PROMPT, schema: z.object({ name: z.string(), age: z.number().int() }),
      ...settings(provider, 64), ...(providerOptions ? { providerOptions } : {}),
    });
    return { object: r.object, finishReason: r.finishReason, usage: usage(r.usage), warnings: r.warnings };
  },
  // AI SDK 7's successor of generateObject: generateText with an output setting.
  async outputObject(model, provider) {
    const r = await generateText({
      model, prompt: STRUCTURED_PROMPT, ...settings(provider, 64),
      output: Output.object({ schema: z.object({ name: z.string(), age: z.number().int() }) }),
    });
    return { object: r.output, finishReason: r.finishReason, usage: usage(r.usage), warnings: r.warnings };
  },
  // One step with a forced call: the named tool (one call), or `required` (one or more: shoal lets the
  // model make parallel calls, and a small one may repeat the call until the token cap cuts the last).
  async tools(model, provider) {
    return toolStep(model, provider, forcesTools[provider] ? NAMED : undefined);
  },
  async toolsRequired(model, provider) {
    return toolStep(model, provider, 'required');
  },
  async streamTools(model, provider) {
    const executed = [];
    const r = streamText({
      model, prompt: TOOL_PROMPT, ...settings(provider, 64), tools: weatherTool(executed),
      ...(forcesTools[provider] ? { toolChoice: NAMED } : {}),
    });
    const parts = new Set();
    for await (const part of r.fullStream) parts.add(part.type);
    return {
      forced: forcesTools[provider], text: await r.text, finishReason: await r.finishReason, steps: 1,
      toolCalls: (await r.toolCalls).map(callShape), toolResults: (await r.toolResults).map(resultShape),
      executed, parts: [...parts],
    };
  },
  // Two steps: a forced call, its result sent back (an assistant tool call and a tool result in the
  // conversation, in each API's shape), then an answer with toolChoice 'none'.
  async twoSteps(model, provider) {
    const executed = [];
    const r = await generateText({
      model, prompt: TOOL_PROMPT, ...settings(provider, 64), tools: weatherTool(executed), toolChoice: NAMED,
      stopWhen: stepCountIs(2), prepareStep: ({ stepNumber }) => (stepNumber === 0 ? {} : { toolChoice: 'none' }),
    });
    return {
      text: r.text, finishReason: r.finishReason, executed,
      steps: r.steps.map((s) => ({ finishReason: s.finishReason, toolCalls: s.toolCalls.map(callShape),
        text: s.text, usage: usage(s.usage) })),
    };
  },
  // A conversation that already holds a call and its result, written by hand: what every provider sends
  // back after a tool ran (the only way to send one to Ollama's API, which cannot force the call).
  async toolHistory(model, provider) {
    const messages = [
      { role: 'user', content: TOOL_PROMPT },
      { role: 'assistant', content: [
        { type: 'tool-call', toolCallId: 'call_1', toolName: 'GetWeather', input: { city: 'Paris' } }] },
      { role: 'tool', content: [{ type: 'tool-result', toolCallId: 'call_1', toolName: 'GetWeather',
        output: { type: 'text', value: 'It is sunny in Paris.' } }] },
    ];
    const r = await generateText({
      model, messages, ...settings(provider), tools: weatherTool([]), toolChoice: 'none',
    });
    const plain = await generateText({ model, prompt: TOOL_PROMPT, ...settings(provider, 1) });
    return {
      text: r.text, finishReason: r.finishReason, usage: usage(r.usage), toolCalls: r.toolCalls.map(callShape),
      plainInputTokens: plain.usage.inputTokens,
    };
  },
};

const NAMED = { type: 'tool', toolName: 'GetWeather' };

function weatherTool(executed) {
  return {
    GetWeather: tool({
      description: 'Get the current weather of a city.',
      inputSchema: z.object({ city: z.string().describe('the city') }),
      execute: async ({ city }) => {
        executed.push(city);
        return `It is sunny in ${city}.`;
      },
    }),
  };
}

const callShape = (c) => ({ toolName: c.toolName, toolCallId: c.toolCallId, input: c.input, invalid: !!c.invalid });
const resultShape = (t) => ({ toolName: t.toolName, output: t.output });

async function toolStep(model, provider, toolChoice) {
  const executed = [];
  const r = await generateText({
    model, prompt: TOOL_PROMPT, ...settings(provider, 64), tools: weatherTool(executed),
    ...(toolChoice ? { toolChoice } : {}),
  });
  return {
    forced: !!toolChoice, text: r.text, finishReason: r.finishReason, steps: r.steps.length,
    toolCalls: r.toolCalls.map(callShape), toolResults: r.toolResults.map(resultShape), executed,
    warnings: r.warnings,
  };
}

async function embeddings(model) {
  const r = await embedMany({ model, values: ['hello', 'the weather in Paris'], maxRetries: 0 });
  return { embeddings: r.embeddings, usage: r.usage };
}

async function report(provider, call, run) {
  const started = Date.now();
  let line;
  try {
    line = { provider, call, ...(await run()) };
  } catch (e) {
    line = { provider, call, error: `${e?.name}: ${e?.message}`, cause: e?.cause ? String(e.cause) : undefined,
      responseBody: e?.responseBody ?? e?.lastError?.responseBody, text: e?.text };
  }
  line.ms = Date.now() - started;
  console.log(JSON.stringify(line));
}

for (const [provider, model] of Object.entries(providers)) {
  for (const [call, run] of Object.entries(calls)) {
    if (FORCED_ONLY.has(call) && !forcesTools[provider]) continue;
    await report(provider, call, () => run(model, provider));
  }
  if (embeddingModels[provider]) await report(provider, 'embedMany', () => embeddings(embeddingModels[provider]));
  // Anthropic's provider writes a schema as a forced `json` tool for a model it does not know; asked to,
  // as the output_config.format of Anthropic's structured outputs.
  if (provider === 'anthropic') {
    await report(provider, 'generateObjectOutputFormat', () => calls.generateObject(model, provider, {
      anthropic: { structuredOutputMode: 'outputFormat' },
    }));
  }
}
