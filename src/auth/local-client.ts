import { constants as fsConstants } from 'node:fs';
import { mkdir, open } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { DatabasePool } from 'slonik';
import type { KeelConfig } from '../config/load-config.js';
import type { KeelLogger } from '../log/logger.js';
import { countActiveClients, countAllClients, createClient, ensureAnonymousClient, type ClientInfo } from './client-repository.js';

export const LOCAL_CLIENT_NAME = 'local';
export const LOCAL_CLIENT_TOKEN_FILE = 'local-client.token';

export type LocalClientResult =
  /** A client `local` was created; its token was printed once and written to `tokenFile` when that was possible. */
  | { action: 'created'; client: ClientInfo; tokenFile: string; fileWritten: true }
  | { action: 'created'; client: ClientInfo; tokenFile: string; fileWritten: false; fileProblem: string }
  /** Nothing to do: `clients_exist` (some client was created before, revoked ones included), `lost_race` (another process created `local` at the same moment), `auth_none` (no tokens in this mode). */
  | { action: 'skipped'; reason: 'clients_exist' | 'lost_race' | 'auth_none' }
  | { action: 'failed'; message: string };

export type LocalClientOptions = {
  /** Where the one-time token line goes (default: process.stderr). */
  write?: (text: string) => void;
};

/**
 * First-start bootstrap (issue 4, "Clients"): under `auth.mode: token`, when no client was ever
 * created, creates the client `local`, writes its token to `<dataDir>/local-client.token` (mode
 * 0600, exclusive create: an existing file is left as it is) and prints the token once on stderr,
 * so the quick start can call the default agent at once.
 *
 * "No client ever" rather than "no active client": an operator who revoked every client (a leaked
 * token, say) does not get a fresh `local` token minted behind their back at the next restart.
 * Concurrent starts race on the unique active name: one creates `local`, the others see
 * `lost_race`. The row is committed before the file is written and the token printed; a process
 * killed in between leaves a `local` client whose token nobody has (revoke it and `keel clients add`).
 *
 * Under `auth.mode: none` it makes sure the anonymous client's row exists and does nothing else.
 */
export async function ensureLocalClient(pool: DatabasePool, config: KeelConfig, logger: KeelLogger, options: LocalClientOptions = {}): Promise<LocalClientResult> {
  const write = options.write ?? ((text: string) => void process.stderr.write(text));
  try {
    if (config.auth.mode === 'none') {
      await ensureAnonymousClient(pool);
      return { action: 'skipped', reason: 'auth_none' };
    }
    if ((await countAllClients(pool)) > 0) {
      if ((await countActiveClients(pool)) === 0) {
        logger.warn('no active client: every A2A request will be refused until one is added with `keel clients add <name>`');
      }
      return { action: 'skipped', reason: 'clients_exist' };
    }
    const created = await createClient(pool, LOCAL_CLIENT_NAME);
    if (!created.ok) {
      if (created.reason === 'name_taken') return { action: 'skipped', reason: 'lost_race' };
      return { action: 'failed', message: `cannot create the client "${LOCAL_CLIENT_NAME}": ${created.message}` };
    }

    const tokenFile = join(config.dataDir, LOCAL_CLIENT_TOKEN_FILE);
    const file = await writeTokenFile(tokenFile, created.token);
    const where = file.ok ? `also in ${tokenFile}` : `not written to ${tokenFile}: ${file.problem}`;
    write(`keel: created client "${LOCAL_CLIENT_NAME}"; its token (shown once, ${where}): ${created.token}\n`);
    logger.info({ client: created.client.id, tokenFile: file.ok ? tokenFile : null }, `created client "${LOCAL_CLIENT_NAME}" on first start`);
    return file.ok
      ? { action: 'created', client: created.client, tokenFile, fileWritten: true }
      : { action: 'created', client: created.client, tokenFile, fileWritten: false, fileProblem: file.problem };
  } catch (error) {
    return { action: 'failed', message: `cannot prepare the client "${LOCAL_CLIENT_NAME}": ${(error as Error).message}` };
  }
}

async function writeTokenFile(path: string, token: string): Promise<{ ok: true } | { ok: false; problem: string }> {
  try {
    await mkdir(dirname(path), { recursive: true, mode: 0o700 });
    // O_EXCL: never overwrite (nor follow a link planted at) an existing file.
    const handle = await open(path, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL, 0o600);
    try {
      await handle.chmod(0o600); // the umask may have narrowed the mode, never widened it; be exact anyway
      await handle.writeFile(`${token}\n`, 'utf8');
    } finally {
      await handle.close();
    }
    return { ok: true };
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'EEXIST') return { ok: false, problem: 'the file exists already and was left unchanged' };
    return { ok: false, problem: code ?? (error as Error).message };
  }
}
