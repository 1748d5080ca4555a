import fc from 'fast-check';
import { BODY_LIMIT, type RawRequest } from './fuzz-support.js';

// Generators of bad (and some good) A2A requests: params of every method with fields of the wrong
// type, missing, huge or nested 10,000 levels deep; unknown fields; broken JSON-RPC envelopes;
// bodies truncated, replaced by random bytes or spiked with invalid UTF-8; odd headers; and the
// REST paths of the same calls with ids encoded every which way.

/** JSON text placed verbatim where a value goes: nesting too deep for JSON.stringify, numbers it cannot write, duplicate keys. */
export class Raw {
  constructor(readonly text: string) {}
}

/** JSON text of a value that may hold Raw parts (only the shallow parts are walked here). */
export function serialize(value: unknown): string {
  if (value instanceof Raw) return value.text;
  if (Array.isArray(value)) return `[${value.map((item) => (item === undefined ? 'null' : serialize(item))).join(',')}]`;
  if (typeof value === 'object' && value !== null) {
    const fields = Object.keys(value)
      .filter((key) => (value as Record<string, unknown>)[key] !== undefined)
      .map((key) => `${JSON.stringify(key)}:${serialize((value as Record<string, unknown>)[key])}`);
    return `{${fields.join(',')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

export const METHODS = [
  'SendMessage',
  'SendStreamingMessage',
  'GetTask',
  'ListTasks',
  'CancelTask',
  'SubscribeToTask',
  'CreateTaskPushNotificationConfig',
  'GetTaskPushNotificationConfig',
  'ListTaskPushNotificationConfigs',
  'DeleteTaskPushNotificationConfig',
  'GetExtendedAgentCard',
] as const;
export type Method = (typeof METHODS)[number];

/** The A2A 0.3 method names (gone in 1.0) and near misses of the 1.0 names. */
const OTHER_METHODS = [
  'message/send',
  'message/stream',
  'tasks/get',
  'tasks/list',
  'tasks/cancel',
  'tasks/resubscribe',
  'tasks/pushNotificationConfig/set',
  'tasks/pushNotificationConfig/get',
  'tasks/pushNotificationConfig/list',
  'tasks/pushNotificationConfig/delete',
  'agent/getAuthenticatedExtendedCard',
  'sendMessage',
  'SENDMESSAGE',
  'SendMessage ',
  ' GetTask',
  'GetTask\u0000',
  'lf.a2a.v1.A2AService/SendMessage',
  'rpc.discover',
  '',
  '__proto__',
  'constructor',
  'toString',
];

type Path = ReadonlyArray<string | number>;

const PUSH_FIELDS: Path[] = [['url'], ['id'], ['token'], ['authentication'], ['authentication', 'scheme'], ['authentication', 'credentials'], ['tenant']];

/** Every field of each method's params (a2a-v1.md, "Methods" and "Data model"), nested ones included. */
export const FIELDS: Record<Method, Path[]> = {
  SendMessage: [
    [],
    ['message'],
    ['message', 'messageId'],
    ['message', 'role'],
    ['message', 'parts'],
    ['message', 'parts', 0],
    ['message', 'parts', 0, 'text'],
    ['message', 'parts', 0, 'raw'],
    ['message', 'parts', 0, 'url'],
    ['message', 'parts', 0, 'data'],
    ['message', 'parts', 0, 'mediaType'],
    ['message', 'parts', 0, 'filename'],
    ['message', 'parts', 0, 'metadata'],
    ['message', 'parts', 1],
    ['message', 'contextId'],
    ['message', 'taskId'],
    ['message', 'referenceTaskIds'],
    ['message', 'referenceTaskIds', 0],
    ['message', 'metadata'],
    ['message', 'extensions'],
    ['configuration'],
    ['configuration', 'acceptedOutputModes'],
    ['configuration', 'historyLength'],
    ['configuration', 'returnImmediately'],
    ['configuration', 'taskPushNotificationConfig'],
    ...PUSH_FIELDS.map((path) => ['configuration', 'taskPushNotificationConfig', ...path]),
    ['metadata'],
    ['tenant'],
  ],
  SendStreamingMessage: [],
  GetTask: [[], ['id'], ['historyLength'], ['tenant']],
  ListTasks: [[], ['contextId'], ['status'], ['pageSize'], ['pageToken'], ['historyLength'], ['statusTimestampAfter'], ['includeArtifacts'], ['tenant']],
  CancelTask: [[], ['id'], ['metadata'], ['tenant']],
  SubscribeToTask: [[], ['id'], ['tenant']],
  CreateTaskPushNotificationConfig: [[], ['taskId'], ...PUSH_FIELDS],
  GetTaskPushNotificationConfig: [[], ['taskId'], ['id'], ['tenant']],
  ListTaskPushNotificationConfigs: [[], ['taskId'], ['pageSize'], ['pageToken'], ['tenant']],
  DeleteTaskPushNotificationConfig: [[], ['taskId'], ['id'], ['tenant']],
  GetExtendedAgentCard: [[], ['tenant']],
};
FIELDS.SendStreamingMessage = FIELDS.SendMessage;

/** What the generators draw ids and URLs from: tasks made before the run, the push receiver. */
export type World = { taskIds: readonly string[]; contextIds: readonly string[]; pushUrl: string; token: string };

const pick = <T>(items: readonly T[]) => fc.nat().map((index) => items[index % items.length]!);

// ---- values ----

const oddStrings = fc.constantFrom(
  '',
  ' ',
  '\u0000',
  'a\u0000b',
  '\ud800',
  'a\udc00b',
  '\ufeff',
  '\u202e',
  '😀',
  '%',
  '%ZZ',
  '..',
  '/',
  'a/b',
  'a:b',
  'null',
  'true',
  '1e999',
  'TASK_STATE_COMPLETED',
  'TASK_STATE_UNSPECIFIED',
  'ROLE_USER',
  'ROLE_AGENT',
  'user',
  '2024-01-01T00:00:00Z',
  '2024-01-01T00:00:00.000+01:00',
  'yesterday',
  'aGVsbG8=',
  '***',
  'javascript:alert(1)',
  'file:///etc/passwd',
  'http://127.0.0.1:9/x',
  'https://10.0.0.1/hook',
  'https://169.254.169.254/latest',
  'http://[::1]/x',
  'ftp://example.com/x',
  '{"a":1}',
  "'; DROP TABLE a2a_tasks; --",
  'x'.repeat(257),
  'x'.repeat(1025),
);

const scalars = fc.oneof(
  fc.constant(null),
  fc.boolean(),
  fc.integer(),
  fc.constantFrom(-1, 0, 1, 2, 3, 5, 6, 8, 9, 99, 100, 101, 1000, 1001, 10_000, 10_001, 2.5, -0.5, 2 ** 31, 2 ** 53 + 2, 1e21, -1e300),
  fc.double(),
  fc.string({ maxLength: 40 }),
  fc.string({ unit: 'binary', maxLength: 40 }),
  oddStrings,
);

/** Numbers and objects that only raw JSON text can carry. */
const rawOddities = fc.constantFrom(
  new Raw('1e999'),
  new Raw('-1e999'),
  new Raw('-0'),
  new Raw('1E400'),
  new Raw('123456789012345678901234567890'),
  new Raw('0.0000000000000000000001'),
  new Raw('{"a":1,"a":2}'),
  new Raw('{"id":"x","id":7}'),
  new Raw('"\\ud800"'),
  new Raw('"\\u0000"'),
  new Raw('[1,2,3,]'),
  new Raw('{"a":1,}'),
  new Raw('NaN'),
  new Raw('undefined'),
  new Raw('0x10'),
  new Raw("'single'"),
);

/** A string or array of a few sizes around the body limit: some bodies fit, some do not. */
const SIZES = [1_000, 16_000, 40_000, BODY_LIMIT - 2_000, BODY_LIMIT - 200, BODY_LIMIT + 100, BODY_LIMIT * 2, BODY_LIMIT * 8] as const;
export const hugeString = fc
  .record({ unit: fc.constantFrom('a', 'é', '😀', '\\', '"', '\u0000', ' '), bytes: fc.constantFrom(...SIZES) })
  .map(({ unit, bytes }) => unit.repeat(Math.max(1, Math.floor(bytes / Buffer.byteLength(JSON.stringify(unit).slice(1, -1))))));
export const hugeArray = fc
  .record({ item: fc.constantFrom<unknown>(0, 'a', null, { text: 'a' }, [], {}), count: fc.constantFrom(101, 1_000, 1_001, 5_000, 20_000) })
  .map(({ item, count }) => Array.from({ length: count }, () => item));

/** Arrays or objects nested `depth` levels, as text (JSON.stringify itself overflows at 10,000). */
export const deepValue = fc
  .record({
    depth: fc.oneof(fc.constantFrom(2, 50, 99, 100, 101, 500, 1_000), fc.constant(10_000)),
    shape: fc.oneof({ arbitrary: fc.constantFrom('array', 'object', 'mixed'), weight: 6 }, { arbitrary: fc.constant('unclosed'), weight: 1 }),
  })
  .map(({ depth, shape }) => {
    switch (shape) {
      case 'array':
        return new Raw('['.repeat(depth) + ']'.repeat(depth));
      case 'object':
        return new Raw('{"a":'.repeat(depth) + '1' + '}'.repeat(depth));
      case 'mixed':
        return new Raw('[{"a":'.repeat(Math.ceil(depth / 2)) + 'null' + '}]'.repeat(Math.ceil(depth / 2)));
      default:
        return new Raw('['.repeat(depth));
    }
  });

const jsonish = fc.jsonValue({ maxDepth: 3 });

/** A value for any field: mostly of a wrong type or an edge of its range, sometimes huge or deep. */
export function fieldValue(world: World): fc.Arbitrary<unknown> {
  return fc.oneof(
    { arbitrary: scalars, weight: 8 },
    { arbitrary: jsonish, weight: 3 },
    { arbitrary: fc.array(scalars, { maxLength: 4 }), weight: 2 },
    { arbitrary: fc.dictionary(fc.string({ maxLength: 8 }), scalars, { maxKeys: 3 }), weight: 2 },
    { arbitrary: pick(world.taskIds), weight: 3 },
    { arbitrary: fc.uuid(), weight: 1 },
    { arbitrary: fc.constant(world.pushUrl), weight: 2 },
    { arbitrary: rawOddities, weight: 2 },
    { arbitrary: hugeString, weight: 1 },
    { arbitrary: hugeArray, weight: 1 },
    { arbitrary: deepValue, weight: 2 },
  );
}

// ---- valid params, the starting point of every mutation ----

const text = fc.string({ maxLength: 30 });
const storableId = fc.string({ minLength: 1, maxLength: 24, unit: 'grapheme-ascii' });
const validPart = fc.oneof(
  { arbitrary: text.map((value) => ({ text: value })), weight: 6 },
  { arbitrary: jsonish.map((value) => ({ data: value ?? 0 })), weight: 2 },
  { arbitrary: fc.constant({ url: 'https://example.com/report.pdf', mediaType: 'application/pdf', filename: 'report.pdf' }), weight: 1 },
  { arbitrary: fc.uint8Array({ maxLength: 24 }).map((bytes) => ({ raw: Buffer.from(bytes).toString('base64'), mediaType: 'text/plain' })), weight: 1 },
);

function validParams(world: World): Record<Method, fc.Arbitrary<Record<string, unknown>>> {
  const taskId = fc.oneof({ arbitrary: pick(world.taskIds), weight: 4 }, { arbitrary: fc.uuid(), weight: 1 }, { arbitrary: storableId, weight: 1 });
  const configId = fc.oneof(fc.constantFrom('cfg-a', 'cfg-b', 'cfg/c', 'cfg:d', 'cfg%e', 'cfg f'), storableId);
  const sendMessage = fc.record(
    {
      message: fc.record(
        {
          messageId: storableId,
          role: fc.constant('ROLE_USER'),
          parts: fc.array(validPart, { minLength: 1, maxLength: 3 }),
          contextId: fc.oneof(pick(world.contextIds), storableId),
          metadata: fc.dictionary(fc.string({ maxLength: 8 }), jsonish, { maxKeys: 3 }),
        },
        { requiredKeys: ['messageId', 'role', 'parts'] },
      ),
      configuration: fc.record(
        {
          returnImmediately: fc.boolean(),
          historyLength: fc.nat(20),
          acceptedOutputModes: fc.constant(['text/plain']),
          taskPushNotificationConfig: fc.record({ url: fc.constant(world.pushUrl), token: storableId }, { requiredKeys: ['url'] }),
        },
        { requiredKeys: [] },
      ),
      metadata: fc.dictionary(fc.string({ maxLength: 8 }), jsonish, { maxKeys: 3 }),
    },
    { requiredKeys: ['message'] },
  );
  return {
    SendMessage: sendMessage,
    SendStreamingMessage: sendMessage,
    GetTask: fc.record({ id: taskId, historyLength: fc.nat(10) }, { requiredKeys: ['id'] }),
    ListTasks: fc.record(
      {
        contextId: pick(world.contextIds),
        status: fc.constantFrom('TASK_STATE_COMPLETED', 'TASK_STATE_WORKING', 3),
        pageSize: fc.integer({ min: 1, max: 100 }),
        historyLength: fc.nat(5),
        includeArtifacts: fc.boolean(),
        statusTimestampAfter: fc.constant('2020-01-01T00:00:00.000Z'),
      },
      { requiredKeys: [] },
    ),
    CancelTask: fc.record({ id: taskId }),
    SubscribeToTask: fc.record({ id: taskId }),
    CreateTaskPushNotificationConfig: fc.record(
      {
        taskId,
        id: configId,
        url: fc.constant(world.pushUrl),
        token: storableId,
        authentication: fc.record({ scheme: fc.constantFrom('Bearer', 'bearer', 'Basic'), credentials: storableId }, { requiredKeys: ['scheme'] }),
      },
      { requiredKeys: ['taskId', 'url'] },
    ),
    GetTaskPushNotificationConfig: fc.record({ taskId, id: configId }),
    ListTaskPushNotificationConfigs: fc.record({ taskId, pageSize: fc.integer({ min: 1, max: 100 }) }, { requiredKeys: ['taskId'] }),
    DeleteTaskPushNotificationConfig: fc.record({ taskId, id: configId }),
    GetExtendedAgentCard: fc.constant({}),
  };
}

// ---- mutations ----

/** Field names that are nobody's, nor a proto name of anybody's (those are mapped to fields). */
export const unknownKey = fc.oneof(
  fc.constantFrom('__proto__', 'constructor', 'toString', 'hasOwnProperty', 'valueOf', 'kind', 'type', 'x-extra', '', ' ', '\u0000', '\ud800', 'ÿ', '😀', 'id ', 'Message', 'TASKID', 'a.b', '$ref'),
  fc.string({ minLength: 1, maxLength: 12 }).map((key) => `x${key.replace(/_/g, '-')}`),
);

type Mutation = { kind: 'set'; path: Path; value: unknown } | { kind: 'delete'; path: Path } | { kind: 'unknown'; path: Path; key: string; value: unknown };

function mutation(method: Method, world: World): fc.Arbitrary<Mutation> {
  const paths = FIELDS[method];
  const objectPaths = paths.filter((path) => typeof path[path.length - 1] !== 'number');
  return fc.oneof(
    { arbitrary: fc.record({ kind: fc.constant('set' as const), path: pick(paths), value: fieldValue(world) }), weight: 6 },
    { arbitrary: fc.record({ kind: fc.constant('delete' as const), path: pick(paths.filter((path) => path.length > 0)) }), weight: 2 },
    { arbitrary: fc.record({ kind: fc.constant('unknown' as const), path: pick(objectPaths), key: unknownKey, value: fieldValue(world) }), weight: 3 },
  );
}

/** A copy of `value` with `path` set: missing or non-object steps are made objects (or arrays before an index). */
function setIn(value: unknown, path: Path, item: unknown): unknown {
  if (path.length === 0) return item;
  const [head, ...rest] = path;
  const base = (
    typeof value === 'object' && value !== null && !(value instanceof Raw) ? (Array.isArray(value) ? [...(value as unknown[])] : { ...(value as object) }) : typeof head === 'number' ? [] : {}
  ) as Record<string | number, unknown>;
  // defineProperty: "__proto__" becomes an own field, as JSON.parse on the other side will make it.
  Object.defineProperty(base, head!, { value: setIn(base[head!], rest, item), enumerable: true, writable: true, configurable: true });
  return base;
}

function deleteIn(value: unknown, path: Path): unknown {
  if (typeof value !== 'object' || value === null || value instanceof Raw) return value;
  const [head, ...rest] = path;
  const base = (Array.isArray(value) ? [...(value as unknown[])] : { ...(value as object) }) as Record<string | number, unknown>;
  if (rest.length === 0) delete base[head!];
  else base[head!] = deleteIn(base[head!], rest);
  return base;
}

function apply(params: unknown, mutations: readonly Mutation[]): unknown {
  let current = params;
  for (const change of mutations) {
    if (change.kind === 'set') current = setIn(current, change.path, change.value);
    else if (change.kind === 'delete') current = deleteIn(current, change.path);
    else {
      let target: unknown = current;
      for (const step of change.path) target = typeof target === 'object' && target !== null ? (target as Record<string | number, unknown>)[step] : undefined;
      if (typeof target === 'object' && target !== null && !Array.isArray(target) && !(target instanceof Raw)) current = setIn(current, [...change.path, change.key], change.value);
    }
  }
  return current;
}

export type Call = { method: Method; params: unknown; mutated: boolean };

/** A call of one of the eleven methods: valid params, then none to three mutations. */
export function call(world: World, methods: readonly Method[] = METHODS): fc.Arbitrary<Call> {
  const valid = validParams(world);
  return pick(methods).chain((method) =>
    fc.record({ params: valid[method], mutations: fc.array(mutation(method, world), { maxLength: 3 }) }).map(({ params, mutations }) => ({
      method,
      params: apply(params, mutations),
      mutated: mutations.length > 0,
    })),
  );
}

/** Valid params of read-only methods plus unknown fields anywhere: the answer must not change. */
export function callWithUnknownFields(world: World): fc.Arbitrary<{ method: Method; params: Record<string, unknown>; withUnknown: unknown }> {
  const valid = validParams(world);
  const methods: Method[] = ['GetTask', 'ListTasks', 'CancelTask', 'GetTaskPushNotificationConfig', 'ListTaskPushNotificationConfigs', 'SubscribeToTask', 'GetExtendedAgentCard'];
  return pick(methods).chain((method) => {
    const objectPaths = FIELDS[method].filter((path) => path.length === 0);
    return fc
      .record({
        params: valid[method],
        extra: fc.array(fc.record({ kind: fc.constant('unknown' as const), path: pick(objectPaths), key: unknownKey, value: fieldValue(world).filter((value) => !isHuge(value) && isJson(value)) }), {
          minLength: 1,
          maxLength: 4,
        }),
      })
      .map(({ params, extra }) => ({ method, params, withUnknown: apply(params, extra) }));
  });
}

const isHuge = (value: unknown) => serialize(value).length > 4_000;
/** Valid JSON nested no deeper than 50 levels (past 100 the whole request is refused, unknown fields included). */
const isJson = (value: unknown) => {
  try {
    const parsed = JSON.parse(serialize(value)) as unknown;
    const pending: Array<[unknown, number]> = [[parsed, 0]];
    while (pending.length) {
      const [item, depth] = pending.pop()!;
      if (depth > 50) return false;
      if (typeof item === 'object' && item !== null) for (const child of Object.values(item)) pending.push([child, depth + 1]);
    }
    return true;
  } catch {
    return false;
  }
};

// ---- JSON-RPC envelopes ----

/** A JSON-RPC envelope around a call, sometimes broken: id, jsonrpc, method or params wrong, batches, non-objects. */
export function envelope(world: World): fc.Arbitrary<unknown> {
  const id = fc.oneof(
    { arbitrary: fc.integer(), weight: 4 },
    { arbitrary: fc.string({ maxLength: 20 }), weight: 4 },
    { arbitrary: fc.constantFrom<unknown>(null, undefined, 0, -0, 1.5, 1e21, '', true, [], {}, [1], { a: 1 }, '\ud800', new Raw('1e999'), new Raw('-0')), weight: 2 },
    { arbitrary: hugeString, weight: 1 },
    { arbitrary: deepValue, weight: 1 },
  );
  const broken = fc.oneof(
    fc.constantFrom<unknown>(null, 0, '', 'SendMessage', true, [], [1], {}),
    fc.array(fc.record({ jsonrpc: fc.constant('2.0'), id: fc.nat(), method: pick(METHODS), params: fc.constant({}) }), { minLength: 1, maxLength: 3 }),
    deepValue,
    hugeArray,
  );
  const wellFormed = fc
    .record({
      call: call(world),
      id,
      jsonrpc: fc.oneof({ arbitrary: fc.constant('2.0'), weight: 12 }, { arbitrary: fc.constantFrom<unknown>('1.0', '2', 2, 2.0, undefined, null, ' 2.0'), weight: 1 }),
      method: fc.oneof({ arbitrary: fc.constant(null), weight: 10 }, { arbitrary: fc.constantFrom(...OTHER_METHODS), weight: 2 }, { arbitrary: fieldValue(world), weight: 1 }),
      paramsShape: fc.oneof({ arbitrary: fc.constant('object'), weight: 12 }, { arbitrary: fc.constantFrom('absent', 'array', 'string', 'null', 'number'), weight: 1 }),
      extra: fc.array(fc.tuple(unknownKey, fieldValue(world)), { maxLength: 2 }),
    })
    .map(({ call: c, id: requestId, jsonrpc, method, paramsShape, extra }) => {
      const params =
        paramsShape === 'object' ? c.params : paramsShape === 'array' ? [c.params] : paramsShape === 'string' ? JSON.stringify(c.params) ?? '' : paramsShape === 'null' ? null : paramsShape === 'number' ? 1 : undefined;
      let body: unknown = { jsonrpc, id: requestId, method: method === null ? c.method : method, params };
      for (const [key, value] of extra) if (!['jsonrpc', 'id', 'method', 'params'].includes(key)) body = setIn(body, [key], value);
      return body;
    });
  return fc.oneof({ arbitrary: wellFormed, weight: 12 }, { arbitrary: broken, weight: 1 });
}

// ---- bytes ----

const INVALID_UTF8: ReadonlyArray<readonly number[]> = [
  [0xff],
  [0xfe, 0xff],
  [0x80],
  [0xbf],
  [0xc0, 0x80],
  [0xc1, 0xbf],
  [0xe0, 0x80, 0x80],
  [0xe2, 0x82],
  [0xed, 0xa0, 0x80],
  [0xed, 0xbf, 0xbf],
  [0xf0, 0x82, 0x82, 0xac],
  [0xf4, 0x90, 0x80, 0x80],
  [0xf8, 0x88, 0x80, 0x80, 0x80],
  [0xfc, 0x84, 0x80, 0x80, 0x80, 0x80],
  [0x00],
];

export type Encoding =
  | { kind: 'json' }
  | { kind: 'truncate'; at: number }
  | { kind: 'invalid-utf8'; spots: Array<{ at: number; bytes: readonly number[] }>; inStrings: boolean }
  | { kind: 'bytes'; bytes: Uint8Array }
  | { kind: 'text'; text: string }
  | { kind: 'bom' }
  | { kind: 'trailing'; text: string };

export const encoding: fc.Arbitrary<Encoding> = fc.oneof(
  { arbitrary: fc.constant({ kind: 'json' as const }), weight: 32 },
  { arbitrary: fc.double({ min: 0, max: 1, noNaN: true }).map((at) => ({ kind: 'truncate' as const, at })), weight: 2 },
  {
    arbitrary: fc
      .record({ spots: fc.array(fc.record({ at: fc.double({ min: 0, max: 1, noNaN: true }), bytes: pick(INVALID_UTF8) }), { minLength: 1, maxLength: 3 }), inStrings: fc.boolean() })
      .map((spec) => ({ kind: 'invalid-utf8' as const, ...spec })),
    weight: 2,
  },
  { arbitrary: fc.uint8Array({ maxLength: 200 }).map((bytes) => ({ kind: 'bytes' as const, bytes })), weight: 1 },
  { arbitrary: fc.oneof(fc.string({ maxLength: 40 }), fc.constantFrom('', ' ', 'null', '{', '}', '[', '{"', "{'a':1}", '{"a":1}{"b":2}', '\u0000', 'true false')).map((value) => ({ kind: 'text' as const, text: value })), weight: 1 },
  { arbitrary: fc.constant({ kind: 'bom' as const }), weight: 1 },
  { arbitrary: fc.constantFrom(' ', '\n', 'x', ',', '}', '// comment', '\u0000').map((value) => ({ kind: 'trailing' as const, text: value })), weight: 1 },
);

/** The bytes of a body: the value's JSON text, broken as `how` says. */
export function encode(value: unknown, how: Encoding): Buffer {
  const json = Buffer.from(serialize(value), 'utf8');
  switch (how.kind) {
    case 'json':
      return json;
    case 'truncate':
      return json.subarray(0, Math.floor(how.at * json.length));
    case 'invalid-utf8': {
      // Inside string values (after an opening quote) the JSON stays well-formed around the bytes.
      const quotes: number[] = [];
      if (how.inStrings) for (let index = 0; index < json.length && quotes.length < 10_000; index++) if (json[index] === 0x22) quotes.push(index + 1);
      const spots = how.spots.map((spot) => ({ at: how.inStrings && quotes.length ? quotes[Math.floor(spot.at * quotes.length) % quotes.length]! : Math.floor(spot.at * json.length), bytes: spot.bytes }));
      spots.sort((a, b) => b.at - a.at);
      let out = json;
      for (const spot of spots) out = Buffer.concat([out.subarray(0, spot.at), Buffer.from(spot.bytes), out.subarray(spot.at)]);
      return out;
    }
    case 'bytes':
      return Buffer.from(how.bytes);
    case 'text':
      return Buffer.from(how.text, 'utf8');
    case 'bom':
      return Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), json]);
    case 'trailing':
      return Buffer.concat([json, Buffer.from(how.text, 'utf8')]);
  }
}

// ---- headers ----

export type HeaderFacts = {
  /** The Authorization header is a valid Bearer token of the client (false: missing or refused). */
  authValid: boolean;
  /** A2A-Version says 1.0 (by header or query); false: missing, empty, another version. */
  versionValid: boolean;
  /** The query string that carries A2A-Version, when that is how it is sent. */
  versionQuery: string;
  /** 'json': a JSON media type; 'other': a well-formed non-JSON type or none; 'odd': anything. */
  contentType: 'json' | 'other' | 'odd';
};

const printable = fc.string({ unit: 'grapheme-ascii', maxLength: 40 });

export function headers(world: World, defaultType: string): fc.Arbitrary<{ list: Array<[string, string]>; facts: HeaderFacts }> {
  const auth = fc.oneof(
    { arbitrary: fc.constantFrom(`Bearer ${world.token}`, `bearer ${world.token}`, `BEARER   ${world.token}  `).map((value) => ({ value: value as string | null, valid: true })), weight: 30 },
    {
      arbitrary: fc
        .oneof(
          fc.constantFrom<string | null>(null, '', 'Bearer', 'Bearer ', `Basic ${world.token}`, `Bearer ${world.token} extra`, `Bearer ${world.token}x`, `Bearer x${world.token}`, `Token ${world.token}`, `Bearer\t${world.token}`, `Bearer ${world.token.toUpperCase()}`),
          printable.map((value) => `Bearer ${value}`),
          printable,
        )
        .map((value) => ({ value, valid: false })),
      weight: 2,
    },
  );
  const version = fc.oneof(
    { arbitrary: fc.constantFrom('1.0', '1', '1.0.0', '1.0.12', ' 1.0 ').map((value) => ({ header: value as string | null, query: '', valid: true })), weight: 30 },
    { arbitrary: fc.constantFrom('1.0', '1.0.3').map((value) => ({ header: null as string | null, query: `A2A-Version=${value}`, valid: true })), weight: 1 },
    {
      arbitrary: fc
        // A random string can spell a supported version ("1", " 1.0"): those are not invalid.
        .oneof(fc.constantFrom<string | null>(null, '', '0.3', '0.3.0', '2.0', '1.1', '1.0.x', 'v1.0', '1.0, 1.0', '10', '1.00', 'latest'), printable.filter((value) => !/^1(\.0(\.\d+)?)?$/.test(value.trim())))
        .map((value) => ({ header: value, query: '', valid: false })),
      weight: 2,
    },
  );
  const contentType = fc.oneof(
    { arbitrary: fc.constant({ value: defaultType as string | null, kind: 'json' as const }), weight: 30 },
    {
      arbitrary: fc
        .constantFrom('application/json', 'application/a2a+json', 'application/json; charset=utf-8', 'Application/JSON', 'application/a2a+json;charset=UTF-8', 'application/json; charset=latin1')
        .map((value) => ({ value: value as string | null, kind: 'json' as const })),
      weight: 3,
    },
    {
      arbitrary: fc.constantFrom('text/plain', 'application/xml', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'application/octet-stream', 'text/event-stream').map((value) => ({
        value: value as string | null,
        kind: 'other' as const,
      })),
      weight: 1,
    },
    {
      arbitrary: fc.oneof(fc.constantFrom<string | null>(null, '', 'application/json;', ';', 'application/', '*/*', 'application/json, text/plain', 'json', 'application/jsonx'), printable).map((value) => ({ value, kind: 'odd' as const })),
      weight: 2,
    },
  );
  const extras = fc.array(
    fc.oneof(
      fc.tuple(fc.constant('A2A-Extensions'), fc.oneof(printable, fc.constantFrom('urn:x', ',,,', 'urn:a2a:tck:required-extension'))),
      fc.tuple(fc.constantFrom('Accept', 'Content-Encoding', 'Transfer-Encoding-Hint', 'X-A2A-Notification-Token', 'Last-Event-ID', 'If-None-Match'), printable),
      fc.tuple(fc.constant('Last-Event-ID'), fc.constantFrom('0', '-1', '1e999', 'abc', '99999999999999999999')),
    ),
    { maxLength: 2 },
  );
  return fc.record({ auth, version, contentType, extras }).map(({ auth: a, version: v, contentType: c, extras: more }) => {
    const list: Array<[string, string]> = [];
    if (a.value !== null) list.push(['authorization', a.value]);
    if (v.header !== null) list.push(['a2a-version', v.header]);
    if (c.value !== null) list.push(['content-type', c.value]);
    // Content-Encoding would make Node refuse or try to inflate; what the server does then is not A2A's business.
    for (const [name, value] of more) if (name !== 'Content-Encoding') list.push([name, value]);
    return {
      list,
      facts: { authValid: a.valid, versionValid: v.valid, versionQuery: v.query, contentType: c.value === null ? 'other' : c.kind },
    };
  });
}

// ---- REST paths ----

export type SegmentMode = 'encoded' | 'double' | 'raw';

/** One path segment for a value of any type; 'raw' puts URL-safe characters and percent signs in unencoded. */
export function segment(value: unknown, mode: SegmentMode): string {
  const textValue = typeof value === 'string' ? value : serialize(value);
  const encodeOnce = (input: string) => {
    let out: string;
    try {
      out = encodeURIComponent(input);
    } catch {
      // Lone surrogates: the bytes Node would send for them.
      out = [...Buffer.from(input, 'utf8')].map((byte) => `%${byte.toString(16).padStart(2, '0').toUpperCase()}`).join('');
    }
    // A WHATWG URL resolves "." and ".." away, encoded as %2E or not: no client can send them as ids.
    return out === '.' || out === '..' ? `x${out}` : out;
  };
  switch (mode) {
    case 'encoded':
      return encodeOnce(textValue) || '%20';
    case 'double':
      return encodeOnce(encodeOnce(textValue)) || '%2520';
    case 'raw': {
      const kept = textValue.replace(/[^A-Za-z0-9%:._~-]/g, '');
      return kept === '' || kept === '.' || kept === '..' ? `x${kept}` : kept;
    }
  }
}

/** Whether a raw path segment holds percent-encoding that is not valid UTF-8. */
export function malformedSegment(raw: string): boolean {
  try {
    decodeURIComponent(raw);
    return false;
  } catch {
    return true;
  }
}

export type RestRequest = RawRequest & {
  /** The ids in the path as the server decodes them (undefined: not in the path, or not decodable). */
  pathIds: { taskId?: string; id?: string };
  /** The operation, or null for a path or verb no operation has. */
  op: Method | null;
  /** A path segment's percent-encoding is malformed (Fastify answers before any route does). */
  malformedPath: boolean;
  /** The request carries a JSON body. */
  hasBody: boolean;
};

/** The params as a query string: every field but the ones in the path (unknown ones too). */
function query(params: unknown, pathKeys: readonly string[], extra: string): string {
  const search = new URLSearchParams();
  if (typeof params === 'object' && params !== null && !Array.isArray(params) && !(params instanceof Raw)) {
    for (const key of Object.keys(params)) {
      if (pathKeys.includes(key)) continue;
      const value = (params as Record<string, unknown>)[key];
      if (value === undefined) continue;
      const textValue = typeof value === 'string' ? value : serialize(value);
      // A query string past Node's 16 KiB header limit is the HTTP server's 431, tested on its own.
      if (textValue.length <= 2_000) search.set(key, textValue);
    }
  }
  const parts = [search.toString(), extra].filter(Boolean);
  return parts.length ? `?${parts.join('&')}` : '';
}

const field = (params: unknown, key: string): unknown => (typeof params === 'object' && params !== null && !(params instanceof Raw) ? (params as Record<string, unknown>)[key] : undefined);
const without = (params: unknown, ...keys: string[]): unknown => {
  if (typeof params !== 'object' || params === null || Array.isArray(params) || params instanceof Raw) return params;
  const copy: Record<string, unknown> = { ...(params as Record<string, unknown>) };
  for (const key of keys) delete copy[key];
  return copy;
};

/** The REST request of a call (a2a-v1.md's bindings), with ids in the path encoded by `mode`. */
export function restRequest(
  agentBase: string,
  c: Call,
  mode: SegmentMode,
  extraQuery: string,
  verb: string | null,
): Omit<RestRequest, 'headers' | 'body'> & { bodyValue: unknown } {
  const decoded: string[] = [];
  const seg = (value: unknown) => {
    const textValue = value === undefined ? '' : value;
    let raw = segment(textValue, mode);
    // Keep the request line well under Node's header limit: long ids are for bodies.
    if (raw.length > 3_000) raw = raw.slice(0, 3_000).replace(/%[0-9A-Fa-f]?$/, '');
    decoded.push(malformedSegment(raw) ? '\u0000(malformed)' : decodeURIComponent(raw));
    return raw;
  };
  const { method, params } = c;
  let httpMethod: string;
  let path: string;
  let bodyValue: unknown;
  switch (method) {
    case 'SendMessage':
    case 'SendStreamingMessage':
      [httpMethod, path, bodyValue] = ['POST', method === 'SendMessage' ? '/message:send' : '/message:stream', params];
      break;
    case 'GetTask':
      [httpMethod, path] = ['GET', `/tasks/${seg(field(params, 'id'))}${query(params, ['id'], extraQuery)}`];
      break;
    case 'ListTasks':
      [httpMethod, path] = ['GET', `/tasks${query(params, [], extraQuery)}`];
      break;
    case 'CancelTask':
      [httpMethod, path, bodyValue] = ['POST', `/tasks/${seg(field(params, 'id'))}:cancel`, without(params, 'id')];
      break;
    case 'SubscribeToTask':
      [httpMethod, path, bodyValue] = ['POST', `/tasks/${seg(field(params, 'id'))}:subscribe`, without(params, 'id')];
      break;
    case 'CreateTaskPushNotificationConfig':
      [httpMethod, path, bodyValue] = ['POST', `/tasks/${seg(field(params, 'taskId'))}/pushNotificationConfigs`, without(params, 'taskId')];
      break;
    case 'GetTaskPushNotificationConfig':
      [httpMethod, path] = ['GET', `/tasks/${seg(field(params, 'taskId'))}/pushNotificationConfigs/${seg(field(params, 'id'))}`];
      break;
    case 'ListTaskPushNotificationConfigs':
      [httpMethod, path] = ['GET', `/tasks/${seg(field(params, 'taskId'))}/pushNotificationConfigs${query(params, ['taskId'], extraQuery)}`];
      break;
    case 'DeleteTaskPushNotificationConfig':
      [httpMethod, path] = ['DELETE', `/tasks/${seg(field(params, 'taskId'))}/pushNotificationConfigs/${seg(field(params, 'id'))}`];
      break;
    case 'GetExtendedAgentCard':
      [httpMethod, path] = ['GET', '/extendedAgentCard'];
      break;
  }
  if (!path.includes('?') && extraQuery) path += `?${extraQuery}`;
  const pathIds = method.includes('PushNotificationConfig') ? { taskId: decoded[0], id: decoded[1] } : { id: decoded[0] };
  const segments = path.split('?')[0]!.split('/');
  const finalMethod = verb ?? httpMethod;
  // The operation the path and verb name (a2a-v1.md's REST bindings): another verb on the same
  // path may be another operation (GET and DELETE of a config, GET and POST of the config list).
  const PATH_OPS: Record<Method, Partial<Record<string, Method>>> = {
    SendMessage: { POST: 'SendMessage' },
    SendStreamingMessage: { POST: 'SendStreamingMessage' },
    GetTask: { GET: 'GetTask' },
    ListTasks: { GET: 'ListTasks' },
    CancelTask: { POST: 'CancelTask' },
    SubscribeToTask: { POST: 'SubscribeToTask', GET: 'SubscribeToTask' },
    CreateTaskPushNotificationConfig: { POST: 'CreateTaskPushNotificationConfig', GET: 'ListTaskPushNotificationConfigs' },
    ListTaskPushNotificationConfigs: { POST: 'CreateTaskPushNotificationConfig', GET: 'ListTaskPushNotificationConfigs' },
    GetTaskPushNotificationConfig: { GET: 'GetTaskPushNotificationConfig', DELETE: 'DeleteTaskPushNotificationConfig' },
    DeleteTaskPushNotificationConfig: { GET: 'GetTaskPushNotificationConfig', DELETE: 'DeleteTaskPushNotificationConfig' },
    GetExtendedAgentCard: { GET: 'GetExtendedAgentCard' },
  };
  const hasBody = finalMethod === 'POST' || finalMethod === 'PUT' || finalMethod === 'PATCH';
  return {
    method: finalMethod,
    path: `${agentBase}${path}`,
    op: PATH_OPS[method][finalMethod] ?? null,
    malformedPath: segments.some(malformedSegment),
    pathIds,
    hasBody,
    bodyValue: hasBody ? (bodyValue ?? {}) : undefined,
  };
}

/** A path under the agent that no operation has. */
export const strayPath = fc.oneof(
  // ("/" is not stray: POST /a2a/<agent>/ is the JSON-RPC endpoint, for clients that add the slash.)
  fc.constantFrom('/message', '/message:sendx', '/v1/message:send', '/tasks/', '/tasks//x', '/tasks/x/y/z', '/tasks/x:archive', '/tasks/x:cancel/y', '/pushNotificationConfigs', '/extendedAgentCard/x', '/.well-known/x', '/tasks/a%2Fb/pushNotificationConfigs/x/y', '/tasks/x:cancel:cancel'),
  fc.array(fc.string({ minLength: 1, maxLength: 12 }), { minLength: 1, maxLength: 4 }).map((parts) => `/${parts.map((part) => segment(part, 'encoded')).join('/')}`),
);

export const VERBS = ['GET', 'POST', 'DELETE', 'PUT', 'PATCH'] as const;

/** Query text besides the params: repeated, malformed or odd parameters. */
export const oddQuery = fc.oneof(
  { arbitrary: fc.constant(''), weight: 12 },
  {
    arbitrary: fc.constantFrom('pageSize=1&pageSize=2', '%ZZ=1', 'a%E0%A4=1', 'a[b]=c', 'historyLength=-1', 'historyLength=1e3', 'includeArtifacts=maybe', 'status=TASK_STATE_WORKING&status=3', '=', '&&&', 'x=%', 'A2A-Version=0.3', 'tenant=%00', '__proto__[x]=1', 'constructor=1'),
    weight: 2,
  },
);
