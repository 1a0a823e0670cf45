// The Vercel AI SDK (`ai` + `@ai-sdk/openai`, whose provider speaks the Responses API, and Chat
// Completions as `openai.chat(...)`: the chat-* scenarios), unmodified,
// against a responses-serve URL. Usage: node vercel_ai.mjs BASE_URL MODEL SCENARIO [API_KEY]
// Prints one JSON object: what the SDK returned and every request body it sent (so the test
// sees what the SDK put on the wire, e.g. item_reference items).
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, jsonSchema, Output, stepCountIs, streamText, tool } from 'ai';

const [baseURL, model, scenario, apiKey = 'sk-unused'] = process.argv.slice(2);
const sent = [];
const recording = async (url, init) => {
  if (init && typeof init.body === 'string') sent.push(JSON.parse(init.body));
  return fetch(url, init);
};
const openai = createOpenAI({ baseURL, apiKey, fetch: recording });

const lookup = tool({
  description: 'Look up the weather of a city',
  inputSchema: jsonSchema({ type: 'object', properties: { city: { type: 'string' } }, required: ['city'] }),
  execute: async ({ city }) => `sunny in ${city}`,
});
const loop = { tools: { lookup }, stopWhen: stepCountIs(3), prompt: 'call lookup {"city": "Paris"}' };
const stored = (store) => ({ openai: store ? {} : { store: false, include: ['reasoning.encrypted_content'] } });

async function run() {
  switch (scenario) {
    case 'generate-store':
    case 'generate-stateless': {
      const result = await generateText({ model: openai(model), ...loop, providerOptions: stored(scenario === 'generate-store') });
      return { text: result.text, steps: result.steps.length, toolResults: result.steps.flatMap((s) => s.toolResults.map((r) => r.output)) };
    }
    case 'stream-store':
    case 'stream-stateless': {
      const result = streamText({ model: openai(model), ...loop, providerOptions: stored(scenario === 'stream-store') });
      let streamed = '';
      for await (const part of result.textStream) streamed += part;
      const steps = await result.steps;
      return { text: await result.text, streamed, steps: steps.length };
    }
    case 'structured': {
      const schema = jsonSchema({
        type: 'object',
        properties: { city: { type: 'string' }, days: { type: 'integer' } },
        required: ['city', 'days'],
        additionalProperties: false,
      });
      const result = await generateText({ model: openai(model), prompt: 'Plan a trip', output: Output.object({ schema }) });
      return { output: result.output };
    }
    case 'previous-response': {
      const first = await generateText({ model: openai(model), prompt: 'Remember the word kiwi' });
      const previousResponseId = first.providerMetadata.openai.responseId;
      const second = await generateText({ model: openai(model), prompt: 'What was the word?', providerOptions: { openai: { previousResponseId } } });
      return { first: first.text, second: second.text, previousResponseId };
    }
    case 'chat-generate': {
      // The provider's Chat Completions model (`openai.chat`): a multi-step tool loop.
      const result = await generateText({ model: openai.chat(model), ...loop });
      return { text: result.text, steps: result.steps.length, toolResults: result.steps.flatMap((s) => s.toolResults.map((r) => r.output)) };
    }
    case 'chat-stream': {
      const result = streamText({ model: openai.chat(model), ...loop });
      let streamed = '';
      for await (const part of result.textStream) streamed += part;
      const steps = await result.steps;
      return { text: await result.text, streamed, steps: steps.length };
    }
    default:
      throw new Error(`unknown scenario ${scenario}`);
  }
}

try {
  console.log(JSON.stringify({ ok: true, result: await run(), sent }));
} catch (error) {
  console.log(JSON.stringify({ ok: false, error: String(error?.stack || error), responseBody: error?.responseBody, sent }));
}
