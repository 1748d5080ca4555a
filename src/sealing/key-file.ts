/**
 * The master key file, created with mode 0600 on a first start (docs/architecture.md, "Privacy").
 *
 * Format: one base64 key per line, the first line the active key (the same syntax parseMasterKeyList
 * accepts, so an operator may add '#' comments). Writers never leave a half-written file where a
 * reader could find it: a key file that is present is always complete.
 */
import { randomBytes } from 'node:crypto';
import { constants } from 'node:fs';
import { link, mkdir, open, rename, unlink, type FileHandle } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { encodeMasterKey, parseMasterKeyList, type MasterKey } from './master-key.js';

export type ReadKeyFileResult =
  | { ok: true; keys: MasterKey[] }
  | { ok: false; reason: 'missing' }
  | { ok: false; reason: 'invalid'; error: string }
  | { ok: false; reason: 'insecure_permissions'; mode: number };

export type CreateKeyFileResult = { ok: true } | { ok: false; reason: 'exists' };

const FILE_MODE = 0o600;
const DIR_MODE = 0o700;
// A key file holds a few keys of 45 bytes each; anything far larger is not a key file.
const MAX_KEY_FILE_BYTES = 64 * 1024;

function errorCode(err: unknown): string | undefined {
  return typeof err === 'object' && err !== null && 'code' in err ? String((err as { code: unknown }).code) : undefined;
}

/**
 * Reads and parses a key file. Refuses a file any group/other bit is set on, since a key others can
 * read is no longer a secret. Permissions are checked on the opened handle, so the file checked is
 * the file read. I/O errors other than a missing file (EACCES, EIO) are thrown.
 */
export async function readKeyFile(path: string): Promise<ReadKeyFileResult> {
  let handle: FileHandle;
  try {
    handle = await open(path, 'r');
  } catch (err) {
    if (errorCode(err) === 'ENOENT') {
      return { ok: false, reason: 'missing' };
    }
    throw err;
  }
  try {
    const stats = await handle.stat();
    if (!stats.isFile()) {
      return { ok: false, reason: 'invalid', error: `${path} is not a regular file` };
    }
    // Mode bits mean nothing on Windows; everywhere else they are the only protection the key has.
    if (process.platform !== 'win32' && (stats.mode & 0o077) !== 0) {
      return { ok: false, reason: 'insecure_permissions', mode: stats.mode & 0o777 };
    }
    if (stats.size > MAX_KEY_FILE_BYTES) {
      return { ok: false, reason: 'invalid', error: `${path} is larger than ${MAX_KEY_FILE_BYTES} bytes` };
    }
    const parsed = parseMasterKeyList(await handle.readFile('utf8'));
    return parsed.ok ? { ok: true, keys: parsed.keys } : { ok: false, reason: 'invalid', error: parsed.error };
  } finally {
    await handle.close();
  }
}

function renderKeys(keys: readonly MasterKey[]): string {
  if (keys.length === 0) {
    throw new RangeError('a key file needs at least one key');
  }
  return keys.map((k) => `${encodeMasterKey(k)}\n`).join('');
}

/**
 * Creates `path` (never over an existing file: 'exists' then) with mode exactly 0600 and `content`,
 * fsync'd before it returns. A write that fails removes the file it created, so no half-written
 * file is left where a later start would take it for a key file.
 */
async function createSyncedFile(path: string, content: string): Promise<CreateKeyFileResult> {
  let handle: FileHandle;
  try {
    handle = await open(path, 'wx', FILE_MODE);
  } catch (err) {
    if (errorCode(err) === 'EEXIST') {
      return { ok: false, reason: 'exists' };
    }
    throw err;
  }
  try {
    // open() applies the umask; chmod makes the mode exactly 0600 whatever the umask is.
    await handle.chmod(FILE_MODE);
    await handle.writeFile(content, 'utf8');
    await handle.sync();
  } catch (err) {
    await handle.close();
    await unlink(path).catch(() => undefined);
    throw err;
  }
  await handle.close();
  return { ok: true };
}

/** Writes a 0600 temp file beside `path` and syncs it; the caller publishes it by rename or link. */
async function writeTempFile(path: string, content: string): Promise<string> {
  const dir = dirname(path);
  await mkdir(dir, { recursive: true, mode: DIR_MODE });
  const temp = join(dir, `.${basename(path)}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`);
  const created = await createSyncedFile(temp, content);
  // The name holds this pid and 48 random bits: an existing file there is not a race but a fault.
  if (!created.ok) throw new Error(`the temporary key file ${temp} already exists`);
  return temp;
}

/** Makes a rename or link in `dir` durable; without it a crash could lose a key that was in use. */
async function syncDir(dir: string): Promise<void> {
  let handle: FileHandle | undefined;
  try {
    handle = await open(dir, constants.O_RDONLY);
    await handle.sync();
  } catch (err) {
    // Some platforms and filesystems cannot fsync a directory; the data itself is already synced.
    if (!['EISDIR', 'EINVAL', 'EPERM', 'ENOTSUP'].includes(errorCode(err) ?? '')) {
      throw err;
    }
  } finally {
    await handle?.close();
  }
}

/** Replaces the key file atomically: readers see the old list or the new one, never a mix. */
export async function writeKeyFile(path: string, keys: readonly MasterKey[]): Promise<void> {
  const content = renderKeys(keys);
  const temp = await writeTempFile(path, content);
  try {
    await rename(temp, path);
  } catch (err) {
    await unlink(temp).catch(() => undefined);
    throw err;
  }
  await syncDir(dirname(path));
}

/**
 * Creates the key file only if none exists, so two processes starting at once never each make a key
 * and seal values the other cannot open. The loser gets 'exists' and should read the winner's file.
 * The complete file is written under a temp name and published with link(), which fails if the path
 * exists; opening the final path with 'wx' and then writing would let the loser read it while still
 * empty. Filesystems without hard links fall back to 'wx' on the final path.
 */
export async function createKeyFileExclusive(path: string, key: MasterKey): Promise<CreateKeyFileResult> {
  const content = renderKeys([key]);
  const temp = await writeTempFile(path, content);
  try {
    await link(temp, path);
  } catch (err) {
    const code = errorCode(err);
    if (code === 'EEXIST') {
      return { ok: false, reason: 'exists' };
    }
    if (code === 'EPERM' || code === 'ENOTSUP' || code === 'EOPNOTSUPP' || code === 'ENOSYS') {
      return createDirectly(path, content);
    }
    throw err;
  } finally {
    await unlink(temp).catch(() => undefined);
  }
  await syncDir(dirname(path));
  return { ok: true };
}

async function createDirectly(path: string, content: string): Promise<CreateKeyFileResult> {
  const created = await createSyncedFile(path, content);
  if (created.ok) await syncDir(dirname(path));
  return created;
}
