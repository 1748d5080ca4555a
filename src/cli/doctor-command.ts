import type { Command } from 'commander';
import { loadConfig } from '../config/load-config.js';
import { problemList } from '../config/module-load-error.js';
import { buildAgentRegistry, unretainableAgents } from '../agents/agent-registry.js';
import { cardSignerFor, loadCardKeyFiles } from '../cards/card-trust.js';
import { createSealer } from '../sealing/sealer.js';
import { createGuardedFetch } from '../net/guarded-fetch.js';
import { createRemoteAgentTool } from '../remote/remote-agent-tool.js';
import { readMigrations } from '../db/migrate.js';
import { probeDatabase } from '../db/pool.js';
import { KeelQueues } from '../queue/keel-queues.js';
import { loadMasterKeys, anySealedValueExists } from '../sealing/master-key-store.js';
import { MasterKeyRing } from '../sealing/master-key.js';
import { openDatabase } from '../runtime/open-database.js';
import { queueBackendFor } from '../queue/queue-backend-for.js';
import { sql } from 'slonik';
import { z } from 'zod';
import { commandLogger, EXIT, type GlobalOptions } from './cli-support.js';

/** How long doctor waits for the database and the queue backend to answer a probe. */
const PROBE_TIMEOUT_MS = 3000;

type Check = { name: string; ok: boolean; detail: string };

/**
 * Checks, in order, config, database, queue backend and master key. The exit code names the first
 * that failed (2 config, 3 database, 4 queue, 5 master key), so scripts can tell them apart.
 */
export function registerDoctorCommand(program: Command, globals: () => GlobalOptions): void {
  program
    .command('doctor')
    .description('check config, database, queue backend and master key; the exit code says which failed')
    .action(async () => {
      const checks: Check[] = [];
      const report = (code: number) => {
        for (const check of checks) process.stdout.write(`${check.ok ? 'ok  ' : 'FAIL'}  ${check.name.padEnd(10)} ${check.detail}\n`);
        process.exitCode = code;
      };

      const loaded = loadConfig({ configPath: globals().config });
      if (!loaded.ok) {
        checks.push({ name: 'config', ok: false, detail: loaded.problems.join('; ') });
        return report(EXIT.config);
      }
      const config = loaded.config;
      const fetch = createGuardedFetch(config.security.addressGuard);
      const registry = await buildAgentRegistry(config, { fetch, extraTools: [createRemoteAgentTool(config, () => null)] });
      await fetch.close();
      if (!registry.ok) {
        // Every problem, each on its own lines: a module's load error carries its code frame.
        checks.push({ name: 'config', ok: false, detail: `${registry.problems.length} problem(s):\n${problemList(registry.problems)}` });
        return report(EXIT.config);
      }
      const cardKeys = loadCardKeyFiles(config);
      if (!cardKeys.ok) {
        checks.push({ name: 'config', ok: false, detail: cardKeys.problems.join('; ') });
        return report(EXIT.config);
      }
      const refused = unretainableAgents(registry.registry);
      checks.push({
        name: 'config',
        ok: true,
        detail: `${config.source ?? 'defaults (no config file)'}; ${config.agents.length} agent(s)${refused.length ? `; refused by A2A (RESULT_NOT_RETAINABLE, answer level metadata or none): ${refused.join(', ')}` : ''}`,
      });

      const logger = commandLogger();
      const opened = await openDatabase(config, logger, 'command', { maximumPoolSize: 2, applicationName: 'keel-doctor' });
      if (!opened.ok) {
        checks.push({ name: 'database', ok: false, detail: opened.message });
        return report(EXIT.database);
      }
      const { pool } = opened.database;
      try {
        const databaseProbe = await probeDatabase(pool, PROBE_TIMEOUT_MS);
        if (!databaseProbe.ok) {
          checks.push({ name: 'database', ok: false, detail: `does not answer: ${databaseProbe.reason}` });
          return report(EXIT.database);
        }
        const files = readMigrations();
        const hasTable = await pool.oneFirst(sql.type(z.object({ t: z.boolean() }))`SELECT to_regclass('keel_migrations') IS NOT NULL AS t`);
        const applied = hasTable ? await pool.anyFirst(sql.type(z.object({ id: z.number() }))`SELECT id FROM keel_migrations`) : [];
        const pending = files.ok ? files.migrations.filter((migration) => !applied.includes(migration.id)).length : 0;
        checks.push({
          name: 'database',
          ok: true,
          detail: `${config.database.url ? 'external' : 'embedded'}; ${pending === 0 ? 'schema current' : `${pending} migration(s) pending (keel migrate)`}`,
        });

        const queues = new KeelQueues(queueBackendFor(config, opened.database.url), logger);
        const queueProbe = await queues.probe(PROBE_TIMEOUT_MS);
        await queues.close().catch(() => undefined);
        checks.push({ name: 'queue', ok: queueProbe.ok, detail: `${queues.backend.kind}${queueProbe.ok ? '' : `: not reachable: ${queueProbe.reason}`}` });
        if (!queueProbe.ok) return report(EXIT.queue);

        const keys = await loadMasterKeys(config.security.masterKeyFile);
        if (!keys.ok && keys.reason === 'invalid') {
          checks.push({ name: 'master key', ok: false, detail: keys.message });
          return report(EXIT.masterKey);
        }
        const needed = hasTable
          ? await pool.anyFirst(sql.type(z.object({ key_id: z.string() }))`SELECT key_id FROM sealing_keys WHERE retired_at IS NULL`)
          : [];
        const sealedExists = hasTable ? await anySealedValueExists(pool) : false;
        if (!keys.ok) {
          const ok = !sealedExists;
          checks.push({
            name: 'master key',
            ok,
            detail: ok ? 'no key yet; `keel start` will create the key file' : `missing: the database needs key ${needed.join(', ')}`,
          });
          return report(ok ? EXIT.ok : EXIT.masterKey);
        }
        const ring = new MasterKeyRing(keys.keys);
        const missing = needed.filter((id) => !ring.byId(id));
        const ok = missing.length === 0 || !sealedExists;
        checks.push({
          name: 'master key',
          ok,
          detail: ok ? `active ${ring.active.id} (${keys.source.kind === 'env' ? 'KEEL_MASTER_KEY' : keys.source.path})` : `the database needs key ${missing.join(', ')}, not available`,
        });
        if (!ok) return report(EXIT.masterKey);
        // A sealed card signing key opens only now that the master keys are known.
        const signing = cardSignerFor(config, cardKeys.fileSigner, createSealer(ring));
        if (signing && !signing.ok) {
          checks.push({ name: 'card key', ok: false, detail: signing.message });
          return report(EXIT.config);
        }
        if (signing) {
          const source = config.security.cardSigning?.keyFile ?? 'sealed (keySealed)';
          checks.push({ name: 'card key', ok: true, detail: `cards signed with ${signing.signer.alg}, kid ${signing.signer.kid} (${source})` });
        }
        return report(EXIT.ok);
      } finally {
        await opened.database.close();
      }
    });
}
