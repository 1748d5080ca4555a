import type { ToolDefinition } from './tool.js';

const MAX_BODY_BYTES = 256 * 1024;
const SHOWN_CHARS = 100_000;

/** `http_get`: fetches a URL through the address guard (no redirects followed, private ranges refused). */
export const httpGetTool: ToolDefinition = {
  name: 'http_get',
  description: 'Fetch a public HTTPS URL and return its status, content type and text body (truncated).',
  parameters: {
    type: 'object',
    properties: { url: { type: 'string', description: 'The https:// URL to fetch' } },
    required: ['url'],
    additionalProperties: false,
  },
  effect: 'read_only',
  needsApproval: false,
  run: async (args, context) => {
    const url = args.url;
    if (typeof url !== 'string' || url.length === 0) return { kind: 'error', message: 'http_get needs a "url" string' };
    const result = await context.fetch({
      url,
      method: 'GET',
      headers: { accept: 'text/*, application/json;q=0.9, */*;q=0.5' },
      timeoutMs: 15_000,
      signal: context.signal,
      maxResponseBytes: MAX_BODY_BYTES,
    });
    if (!result.ok) {
      return {
        kind: 'error',
        message: result.kind === 'refused' ? `refused: ${result.refusal.detail}` : `request failed (${result.failure.class}): ${result.failure.message}`,
      };
    }
    const { response } = result;
    const text = response.body.toString('utf8');
    return {
      kind: 'ok',
      content: {
        status: response.status,
        contentType: response.headers['content-type'] ?? null,
        location: response.status >= 300 && response.status < 400 ? (response.headers.location ?? null) : undefined,
        body: text.length > SHOWN_CHARS ? `${text.slice(0, SHOWN_CHARS)}…` : text,
        truncated: text.length > SHOWN_CHARS,
      },
    };
  },
};
