// The backstop of a benchmark's clean-up. bench/keel-harness.ts starts this process for each bench
// (detached, plain JavaScript so it starts at once, with an IPC channel) and tells it what the bench
// starts: process groups, a private Postgres cluster, bench databases, temporary directories; and
// what it has cleaned up itself. When the benchmark goes away with something still on the list (it
// was killed: `tsx` SIGKILLs a child that does not acknowledge a relayed Ctrl-C within about 60 ms,
// which a busy load generator may not), the IPC channel closes and this process stops and removes
// what is left. After a normal end the list is empty and it just exits.
//
// Messages: { op: 'bye' } at a normal end, else { op: 'add' | 'remove', kind, ... }:
//   group     { pid }              a detached child's process group: SIGTERM, SIGKILL after 15 s
//   postgres  { pid, dir }         a private cluster's postmaster: SIGINT (fast shutdown), then its dir
//   database  { name, adminUrl }   a bench database: DROP DATABASE ... WITH (FORCE)
//   dir       { path }             a temporary directory: removed

import { rmSync } from 'node:fs';

const groups = new Set();
const postgres = new Map();
const databases = new Map();
const dirs = new Set();

const key = (message) => {
  switch (message.kind) {
    case 'group':
      return [groups, message.pid, message.pid];
    case 'postgres':
      return [postgres, message.pid, message.dir];
    case 'database':
      return [databases, message.name, message.adminUrl];
    case 'dir':
      return [dirs, message.path, message.path];
    default:
      return null;
  }
};

process.on('message', (message) => {
  // The benchmark ended and cleaned up after itself.
  if (message?.op === 'bye') process.exit(0);
  const entry = key(message ?? {});
  if (!entry) return;
  const [store, id, value] = entry;
  if (message.op === 'add') {
    if (store instanceof Map) store.set(id, value);
    else store.add(id);
  } else if (message.op === 'remove') {
    store.delete(id);
  }
});

// A Ctrl-C in the benchmark's terminal is the benchmark's to handle; this process runs on.
process.on('SIGINT', () => undefined);
process.on('SIGHUP', () => undefined);

const alive = (pid) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

const signal = (pid, name) => {
  try {
    process.kill(pid, name);
  } catch {
    // Gone already.
  }
};

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function waitGone(pids, ms) {
  const deadline = Date.now() + ms;
  while (pids.some(alive) && Date.now() < deadline) await sleep(100);
  return pids.filter(alive);
}

async function cleanUp() {
  const leftovers = groups.size + postgres.size + databases.size + dirs.size;
  if (leftovers > 0) console.error(`bench cleanup: the benchmark went away; stopping ${groups.size} server(s), dropping ${databases.size} database(s)`);
  // Servers first (a Keel process drains its runs on SIGTERM), by process group.
  const leaders = [...groups];
  for (const pid of leaders) signal(-pid, 'SIGTERM');
  for (const pid of await waitGone(leaders, 15_000)) signal(-pid, 'SIGKILL');
  // Databases while their server is still up.
  if (databases.size > 0) {
    try {
      const { default: pg } = await import('pg');
      for (const [name, adminUrl] of databases) {
        const client = new pg.Client({ connectionString: adminUrl });
        try {
          await client.connect();
          await client.query(`DROP DATABASE IF EXISTS "${name.replace(/"/g, '""')}" WITH (FORCE)`);
        } catch (error) {
          console.error(`bench cleanup: could not drop ${name}: ${error.message}`);
        } finally {
          await client.end().catch(() => undefined);
        }
      }
    } catch (error) {
      console.error(`bench cleanup: could not drop the bench databases: ${error.message}`);
    }
  }
  const postmasters = [...postgres.keys()];
  for (const pid of postmasters) signal(pid, 'SIGINT');
  for (const pid of await waitGone(postmasters, 15_000)) signal(pid, 'SIGQUIT');
  await waitGone(postmasters, 5_000);
  for (const dir of [...postgres.values(), ...dirs]) rmSync(dir, { recursive: true, force: true });
  process.exit(0);
}

process.on('disconnect', () => void cleanUp());
if (!process.connected) void cleanUp();
