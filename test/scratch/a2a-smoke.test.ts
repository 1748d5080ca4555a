import { describe, it, expect, afterAll } from 'vitest';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';

let keel: TestKeel;
afterAll(async () => keel?.dispose());
describe('smoke', () => {
  it('json-rpc send', async () => {
    keel = await startTestKeel({ overrides: { KEEL_AUTH_MODE: 'none' } });
    const post = (body: unknown) => fetch(`${keel.url}/a2a/echo`, { method: 'POST', headers: { 'content-type': 'application/json', 'a2a-version': '1.0' }, body: JSON.stringify(body) });
    const t0 = Date.now();
    const res = await post({ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: { message: { messageId: 'm1', role: 'ROLE_USER', parts: [{ text: 'hello' }] } } });
    const json = await res.json();
    console.log(Date.now() - t0, 'ms', JSON.stringify(json, null, 1));
    const id = json.result.task.id;
    const got = await (await post({ jsonrpc: '2.0', id: 2, method: 'GetTask', params: { id } })).json();
    console.log(JSON.stringify(got));
    const list = await (await post({ jsonrpc: '2.0', id: 3, method: 'ListTasks', params: {} })).json();
    console.log(JSON.stringify(list));
    const card = await (await fetch(`${keel.url}/.well-known/agent-card.json`)).json();
    console.log(JSON.stringify(card));
    const s = await fetch(`${keel.url}/a2a/echo/message:stream`, { method: 'POST', headers: { 'content-type': 'application/json', 'a2a-version': '1.0' }, body: JSON.stringify({ message: { messageId: 'm2', role: 'ROLE_USER', parts: [{ text: 'streamed' }] } }) });
    console.log(s.status, await s.text());
    expect(json.result.task.status.state).toBe('TASK_STATE_COMPLETED');
  });
});
