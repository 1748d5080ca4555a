import { startTestKeel } from '../support/test-keel.js';
import { createClient } from '../../src/auth/client-repository.js';
const keel = await startTestKeel({ overrides: { KEEL_SERVER_BODY_LIMIT_BYTES: '65536', KEEL_PROVIDERS: { echo: { type: 'echo' } }, KEEL_AGENTS: [{ id: 'echo', name: 'Echo', provider: 'echo', privacy: { answerLevel: 'full' } }] } });
const c = await createClient(keel.context.pool, 'p'); if (!c.ok) throw new Error();
const h = { authorization: `Bearer ${c.token}`, 'a2a-version': '1.0', 'content-type': 'application/json' };
async function go(method: string, path: string, body?: string | Buffer, headers: Record<string, string> = h) {
  const r = await fetch(keel.url + path, { method, headers, body });
  console.log(method, path.slice(0, 80), r.status, r.headers.get('content-type'), (await r.text()).slice(0, 200));
}
await go('GET', '/a2a/echo/tasks/%E0%A4%A');
await go('GET', '/a2a/echo/tasks/%ZZ');
await go('GET', '/a2a/%ZZ/tasks');
await go('POST', '/a2a/%ZZ', '{}');
await go('POST', '/a2a/echo', Buffer.from([0x7b, 0xff, 0x7d]));
await go('POST', '/a2a/echo', Buffer.from('{"jsonrpc":"2.0","id":"\xff","method":"GetTask","params":{"id":"a\xc0\x80"}}', 'latin1'));
await go('POST', '/a2a/echo', Buffer.alloc(70000, 0x20));
await go('POST', '/a2a/echo/message:send', Buffer.alloc(70000, 0x20));
await go('POST', '/a2a/inbox/x', Buffer.alloc(70000, 0x20));
await go('POST', '/a2a/inbox/' + crypto.randomUUID(), '{}', { authorization: 'Bearer x' });
await go('POST', '/a2a/inbox/', '{}', { authorization: 'Bearer x' });
await go('OPTIONS', '/a2a/echo/tasks');
await go('HEAD', '/a2a/echo/tasks');
await go('POST', '/a2a/echo', '{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}', { ...h, 'content-type': 'application/json; charset=latin1' });
await go('POST', '/a2a/echo', '{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}', { ...h, 'content-type': 'APPLICATION/JSON' });
await go('POST', '/a2a/echo', '{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}', { ...h, 'content-encoding': 'gzip' });
await go('POST', '/a2a/echo', '{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}', { ...h, 'content-type': 'application/json; charset=utf-16' });
await go('GET', '/readyz');
await keel.dispose();
