import { z } from 'zod';

// The A2A 1.0 wire format (ProtoJSON names, camelCase), validated at the edge. Unknown fields are
// dropped; a field of the wrong type is an invalid-params error naming the field.

export const TASK_STATES = [
  'TASK_STATE_SUBMITTED',
  'TASK_STATE_WORKING',
  'TASK_STATE_INPUT_REQUIRED',
  'TASK_STATE_AUTH_REQUIRED',
  'TASK_STATE_COMPLETED',
  'TASK_STATE_FAILED',
  'TASK_STATE_CANCELED',
  'TASK_STATE_REJECTED',
] as const;
export type TaskState = (typeof TASK_STATES)[number];
export const TERMINAL_TASK_STATES: readonly TaskState[] = ['TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_REJECTED'];
export const INTERRUPTED_TASK_STATES: readonly TaskState[] = ['TASK_STATE_INPUT_REQUIRED', 'TASK_STATE_AUTH_REQUIRED'];
export const isTerminalState = (state: string) => (TERMINAL_TASK_STATES as readonly string[]).includes(state);
export const endsStream = (state: string) => isTerminalState(state) || (INTERRUPTED_TASK_STATES as readonly string[]).includes(state);

// Text that reaches a database column or query as text or jsonb: Postgres stores neither NUL nor
// a lone UTF-16 surrogate, so such a value is refused here instead of failing the statement.
// eslint-disable-next-line no-control-regex -- NUL is exactly what this pattern refuses
const STORABLE = /^[^\u0000\uD800-\uDFFF]*$/u;
const STORABLE_MESSAGE = 'must be well-formed text without NUL characters';
const storable = () => z.string().regex(STORABLE, STORABLE_MESSAGE);
const storableJson = (value: unknown): boolean =>
  typeof value === 'string'
    ? STORABLE.test(value)
    : Array.isArray(value)
      ? value.every(storableJson)
      : typeof value === 'object' && value !== null
        ? Object.entries(value).every(([key, item]) => STORABLE.test(key) && storableJson(item))
        : true;

// How deep a request (or an inbox callback) may nest arrays and objects: the default recursion
// limit of protobuf's JSON parsers. Everything past the edge walks values recursively (ProtoJSON
// names, the checks above, JSON.stringify when sealing), and a body of 10,000 levels, a few dozen
// kilobytes, overflowed the stack there: a 500 instead of an invalid-params error.
export const MAX_JSON_DEPTH = 100;

/** Whether a parsed JSON value nests arrays and objects deeper than `max`; iterative, so any depth is safe to ask about. */
export function nestsDeeperThan(value: unknown, max: number): boolean {
  const pending: Array<[unknown, number]> = [[value, 0]];
  while (pending.length > 0) {
    const [item, depth] = pending.pop()!;
    if (typeof item !== 'object' || item === null) continue;
    if (depth >= max) return true;
    for (const child of Array.isArray(item) ? item : Object.values(item)) pending.push([child, depth + 1]);
  }
  return false;
}

const metadata = z.record(z.unknown()).refine(storableJson, `metadata keys and strings ${STORABLE_MESSAGE}`);
const nonEmpty = storable().min(1).max(1024);

// ProtoJSON accepts an enum by name or by number.
const ROLE_NUMBERS: Record<number, 'ROLE_USER' | 'ROLE_AGENT'> = { 1: 'ROLE_USER', 2: 'ROLE_AGENT' };
const role = z.union([z.enum(['ROLE_USER', 'ROLE_AGENT']), z.number().int().transform((value, context) => {
  const name = ROLE_NUMBERS[value];
  if (!name) context.addIssue({ code: z.ZodIssueCode.custom, message: 'expected ROLE_USER or ROLE_AGENT' });
  return name ?? 'ROLE_USER';
})]);

const partCommon = {
  mediaType: z.string().max(256).optional(),
  filename: z.string().max(1024).optional(),
  metadata: metadata.optional(),
};
export const partSchema = z
  .object({
    text: z.string().optional(),
    raw: z.string().regex(/^[A-Za-z0-9+/_-]*={0,2}$/, 'expected base64').optional(),
    url: z.string().url().optional(),
    data: z.unknown().optional(),
    ...partCommon,
  })
  .superRefine((part, context) => {
    const present = (['text', 'raw', 'url', 'data'] as const).filter((key) => part[key] !== undefined);
    if (present.length !== 1) {
      context.addIssue({ code: z.ZodIssueCode.custom, message: `a part has exactly one of text, raw, url, data (found ${present.length ? present.join(', ') : 'none'})` });
    }
  });
export type WirePart = z.infer<typeof partSchema>;

export const messageSchema = z.object({
  messageId: nonEmpty,
  role,
  parts: z.array(partSchema).min(1, 'a message has at least one part').max(1000),
  contextId: nonEmpty.max(256).optional(),
  taskId: nonEmpty.optional(),
  referenceTaskIds: z.array(nonEmpty).max(100).optional(),
  metadata: metadata.optional(),
  extensions: z.array(z.string()).max(100).optional(),
});
export type WireMessage = z.infer<typeof messageSchema>;

// Push configs are stored with text columns (id, url, scheme, the hints of token and credentials).
// Keel sends a push credential only as `Authorization: Bearer <credentials>` (docs/push.md), so a
// config naming another scheme is refused here, before anything is stored. Auth schemes are
// case-insensitive (RFC 7235, section 2.1): `bearer` is accepted and stored as `Bearer`.
export const PUSH_AUTH_SCHEME = 'Bearer';
export const authenticationSchema = z.object({
  scheme: storable()
    .min(1)
    .max(64)
    .refine(
      (scheme) => scheme.toLowerCase() === PUSH_AUTH_SCHEME.toLowerCase(),
      (scheme) => ({ message: `only the ${PUSH_AUTH_SCHEME} scheme is supported for push notifications, not ${JSON.stringify(scheme)}` }),
    )
    .transform(() => PUSH_AUTH_SCHEME),
  credentials: storable().max(8192).optional(),
});

export const pushConfigInputSchema = z.object({
  id: storable().min(1).max(256).optional(),
  taskId: z.string().optional(),
  url: storable().min(1).max(4096),
  token: storable().max(4096).optional(),
  authentication: authenticationSchema.optional(),
  tenant: z.string().optional(),
});

export const sendMessageParamsSchema = z.object({
  message: messageSchema,
  configuration: z
    .object({
      acceptedOutputModes: z.array(z.string()).max(100).optional(),
      taskPushNotificationConfig: pushConfigInputSchema.optional(),
      historyLength: z.number().int().min(0).max(10_000).optional(),
      returnImmediately: z.boolean().optional(),
    })
    .optional(),
  metadata: metadata.optional(),
  tenant: z.string().optional(),
});
export type SendMessageParams = z.infer<typeof sendMessageParamsSchema>;

export const getTaskParamsSchema = z.object({ id: nonEmpty, historyLength: z.number().int().min(0).max(10_000).optional(), tenant: z.string().optional() });
export const cancelTaskParamsSchema = z.object({ id: nonEmpty, metadata: metadata.optional(), tenant: z.string().optional() });
// `metadata` is not in A2A 1.0's SubscribeToTaskRequest: the sequenced-events extension's resume point (src/a2a/sequenced-events.ts).
export const subscribeParamsSchema = z.object({ id: nonEmpty, metadata: metadata.optional(), tenant: z.string().optional() });

// The numbers of a2a.proto's TaskState (not the order of TASK_STATES above).
const TASK_STATE_NUMBERS: Record<number, TaskState> = {
  1: 'TASK_STATE_SUBMITTED',
  2: 'TASK_STATE_WORKING',
  3: 'TASK_STATE_COMPLETED',
  4: 'TASK_STATE_FAILED',
  5: 'TASK_STATE_CANCELED',
  6: 'TASK_STATE_INPUT_REQUIRED',
  7: 'TASK_STATE_REJECTED',
  8: 'TASK_STATE_AUTH_REQUIRED',
};
const taskState = z.union([
  z.enum(TASK_STATES),
  z.number().int().transform((value, context) => {
    const state = TASK_STATE_NUMBERS[value];
    if (!state) context.addIssue({ code: z.ZodIssueCode.custom, message: 'expected a TaskState' });
    return state ?? 'TASK_STATE_SUBMITTED';
  }),
]);

// Proto defaults mean "not set": TASK_STATE_UNSPECIFIED (0) filters nothing, "" is no value.
const unset = (value: unknown) => (value === 'TASK_STATE_UNSPECIFIED' || value === 0 || value === '' || value === null ? undefined : value);

export const listTasksParamsSchema = z.object({
  contextId: z.preprocess(unset, storable().max(256).optional()),
  status: z.preprocess(unset, taskState.optional()),
  pageSize: z.number().int().min(1).max(100).optional(),
  pageToken: storable().max(512).optional(),
  historyLength: z.number().int().min(0).max(10_000).optional(),
  statusTimestampAfter: z.preprocess(unset, z.string().datetime({ offset: true }).optional()),
  includeArtifacts: z.boolean().optional(),
  tenant: z.string().optional(),
});
export type ListTasksParams = z.infer<typeof listTasksParamsSchema>;

export const createPushConfigParamsSchema = pushConfigInputSchema.extend({ taskId: nonEmpty });
export const getPushConfigParamsSchema = z.object({ taskId: nonEmpty, id: nonEmpty, tenant: z.string().optional() });
export const listPushConfigsParamsSchema = z.object({
  taskId: nonEmpty,
  pageSize: z.number().int().min(1).max(100).optional(),
  pageToken: storable().max(512).optional(),
  tenant: z.string().optional(),
});
export const deletePushConfigParamsSchema = getPushConfigParamsSchema;
export const extendedCardParamsSchema = z.object({ tenant: z.string().optional() }).passthrough();

/** Outbound shapes (what Keel sends). */
export type Part = { text?: string; raw?: string; url?: string; data?: unknown; mediaType?: string; filename?: string; metadata?: Record<string, unknown> };
export type Message = {
  messageId: string;
  role: 'ROLE_USER' | 'ROLE_AGENT';
  parts: Part[];
  contextId?: string;
  taskId?: string;
  metadata?: Record<string, unknown>;
  referenceTaskIds?: string[];
  extensions?: string[];
};
export type Artifact = { artifactId: string; name?: string; description?: string; parts: Part[]; metadata?: Record<string, unknown> };
export type TaskStatus = { state: TaskState; message?: Message; timestamp: string };
export type Task = { id: string; contextId: string; status: TaskStatus; artifacts?: Artifact[]; history?: Message[]; metadata?: Record<string, unknown> };
export type StreamResponse =
  | { task: Task }
  | { message: Message }
  | { statusUpdate: { taskId: string; contextId: string; status: TaskStatus; metadata?: Record<string, unknown> } }
  | { artifactUpdate: { taskId: string; contextId: string; artifact: Artifact; append?: boolean; lastChunk?: boolean; metadata?: Record<string, unknown> } };

/** ISO 8601 UTC with Z and millisecond precision. */
export const isoTime = (ms: number) => new Date(ms).toISOString();

/** How a message becomes model input: text parts as they are, data as JSON, files named. */
export function messageText(message: Pick<WireMessage, 'parts'>): string {
  return message.parts
    .map((part) => {
      if (part.text !== undefined) return part.text;
      if (part.data !== undefined) return JSON.stringify(part.data);
      if (part.url !== undefined) return `[file ${part.filename ?? ''} ${part.mediaType ?? ''} at ${part.url}]`.replace(/\s+/g, ' ');
      return `[file ${part.filename ?? ''} ${part.mediaType ?? ''}, ${Math.floor(((part.raw ?? '').length * 3) / 4)} bytes]`.replace(/\s+/g, ' ');
    })
    .join('\n');
}
