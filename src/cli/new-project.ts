import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { basename, dirname, isAbsolute, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AGENT_ID } from '../config/config-schema.js';
import { agentMachineSource, agentTestSource } from './agent-scaffold-sources.js';

// `keel new project <dir>`: a team's own repository with Keel as a dependency
// (docs/statechart-agents.md; decision 0078): package.json, keel.config.yaml serving one
// statechart agent, the agent's machine and its vitest test, .gitignore and a README. `npm install
// && npm test` and `npm start` work in it as written. The versions of xstate and vitest, the
// overrides and the install scripts allowed are the running Keel's own, so the team's install
// resolves what Keel was tested with.

/** Keel's package.json: the fields a project copies. */
export type KeelManifest = {
  version: string;
  dependencies?: Record<string, string>;
  devDependencies?: Record<string, string>;
  overrides?: Record<string, unknown>;
  allowScripts?: Record<string, boolean>;
};

export type KeelPackage = { root: string; manifest: KeelManifest };

/**
 * The Keel this code belongs to: the nearest package.json above this module named `keel`. From a
 * checkout's sources, its compiled build under node_modules/.cache/keel and a packed Keel's dist/
 * alike, that is the package's own.
 */
export function runningKeel(from = fileURLToPath(import.meta.url)): KeelPackage {
  for (let dir = dirname(from); ; dir = dirname(dir)) {
    const file = join(dir, 'package.json');
    if (existsSync(file)) {
      const manifest = JSON.parse(readFileSync(file, 'utf8')) as KeelManifest & { name?: string };
      if (manifest.name === 'keel') return { root: dir, manifest };
    }
    if (dirname(dir) === dir) throw new Error(`no package.json named keel above ${from}`);
  }
}

/** The `keel` spec a project's package.json names, in a project whose package.json is in projectDir. */
function dependencySpec(projectDir: string): string | null {
  try {
    const manifest = JSON.parse(readFileSync(join(projectDir, 'package.json'), 'utf8')) as Record<string, Record<string, string> | undefined>;
    return manifest.dependencies?.keel ?? manifest.devDependencies?.keel ?? manifest.optionalDependencies?.keel ?? null;
  } catch {
    return null;
  }
}

/**
 * Where the new project gets Keel by default: where the running Keel came from. A checkout is
 * named by its path; a Keel installed as a dependency (a tarball, a git URL, a registry version,
 * also npx's own install) by the spec its project's package.json gives, a relative file: path made
 * absolute; otherwise by its version.
 */
export function defaultKeelSpec(keel: KeelPackage): string {
  if (existsSync(join(keel.root, 'src'))) return `file:${keel.root}`;
  const parent = dirname(keel.root);
  const spec = basename(parent) === 'node_modules' ? dependencySpec(dirname(parent)) : null;
  if (spec === null) return keel.manifest.version;
  if (spec.startsWith('file:')) {
    const path = spec.slice('file:'.length);
    return isAbsolute(path) ? spec : `file:${resolve(dirname(parent), path)}`;
  }
  return spec;
}

export type ScaffoldProjectInput = {
  dir: string;
  /** The agent's id, and its files' name. */
  agent: string;
  /** The `keel` dependency's spec (a version, a tarball path, a git URL). */
  keelSpec: string;
  keel: KeelManifest;
};

export type ScaffoldProjectResult =
  | { ok: true; dir: string; files: string[] }
  | { ok: false; reason: 'invalid_name' | 'not_empty' | 'unwritable'; message: string };

/** A directory's name as an npm package name: lowercase, the characters npm allows. */
function packageName(dir: string): string {
  const name = basename(dir)
    .toLowerCase()
    .replace(/[^a-z0-9._-]+/g, '-')
    .replace(/^[._-]+/, '');
  return name === '' ? 'keel-agents' : name.slice(0, 214);
}

function displayName(id: string): string {
  const text = id.split(/[-_]+/).filter((word) => word !== '').join(' ');
  return text.charAt(0).toUpperCase() + text.slice(1);
}

export function projectPackageJson(name: string, input: Pick<ScaffoldProjectInput, 'keelSpec' | 'keel'>): string {
  const { keel } = input;
  const xstate = keel.dependencies?.xstate;
  const vitest = keel.devDependencies?.vitest;
  if (xstate === undefined || vitest === undefined) throw new Error("Keel's package.json names no xstate dependency or vitest devDependency");
  const manifest = {
    name,
    version: '0.1.0',
    private: true,
    type: 'module',
    // vitest 4 (and the vite it runs on) needs 20.19; Keel itself runs from 20.10.
    engines: { node: '>=20.19' },
    scripts: { start: 'keel start', test: 'vitest run' },
    dependencies: { keel: input.keelSpec, xstate },
    devDependencies: { vitest },
    ...(keel.overrides === undefined ? {} : { overrides: keel.overrides }),
    // Keel's own, and Keel's `prepare`, which builds it when it is installed from a git URL.
    allowScripts: { ...keel.allowScripts, keel: true },
  };
  return `${JSON.stringify(manifest, null, 2)}\n`;
}

export function projectConfig(agent: string): string {
  return `# Keel's configuration for this repository; \`npm start\` (keel start) reads it. Every key, with its
# default: node_modules/keel/keel.config.example.yaml. Paths are relative to this file. Without a
# database.url Keel runs its own Postgres with its data in .keel/ (with the master key and the local
# client's token); set database.url (or KEEL_DATABASE_URL) to use a server of yours.

server:
  host: 127.0.0.1
  port: 8080

providers:
  # Stands in for a model: it answers with the client's last message, prefixed "echo: ". For a real
  # model, an OpenAI-compatible endpoint:
  #   model:
  #     type: openai
  #     baseUrl: https://api.openai.com/v1
  #     model: gpt-4o-mini
  #     apiKeyEnv: OPENAI_API_KEY      # the environment variable holding the key
  model:
    type: echo

agents:
  - id: ${agent}
    name: ${displayName(agent)}
    description: Answers a request, asking the client for more detail when it needs it
    version: 0.1.0
    machine: ./agents/${agent}.machine.ts   # the statechart that drives each run (npm test tests it)
    provider: model                         # what its callModel steps call
    tools: []                               # what its callTool steps may call (toolModules)
    skills:
      - id: answer
        name: Answer a request
        description: Answers, or asks for more detail first
        tags: [statechart]
`;
}

const GITIGNORE = `node_modules/
# Keel's data: the embedded Postgres, the master key, the local client's token.
.keel/
`;

export function projectReadme(name: string, agent: string): string {
  return `# ${name}

A2A agents served by [Keel](node_modules/keel/README.md), a durable A2A 1.0 runtime. The agent
\`${agent}\` is a statechart (\`agents/${agent}.machine.ts\`): Keel runs each request to it as a
durable run and commits every transition, so a crash resumes from the last state reached. How to
write one: node_modules/keel/docs/statechart-agents.md.

## Test, start, call

\`\`\`sh
npm install
npm test          # the machine's vitest test: in memory, with stand-ins for Keel's steps
npm start         # Keel on port 8080, on its own Postgres in .keel/ (keel.config.yaml)
\`\`\`

On the first start Keel creates the client \`local\` and writes its token to
\`.keel/local-client.token\`. Every A2A call carries it:

\`\`\`sh
TOKEN=$(cat .keel/local-client.token)
curl -s localhost:8080/a2a/${agent} \\
  -H "Authorization: Bearer $TOKEN" -H 'A2A-Version: 1.0' -H 'Content-Type: application/json' \\
  -d '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"hello"}]}}}'
# → ... "status":{"state":"TASK_STATE_COMPLETED"...}, "artifacts":[{... "parts":[{"text":"echo: hello"}]}] ...
\`\`\`

The provider \`model\` in keel.config.yaml is \`echo\`, which answers with the message it got;
replace it with an \`openai\` provider for a real model. Its card:
\`curl -s localhost:8080/a2a/${agent}/.well-known/agent-card.json\`.

## More

- \`npx keel new agent <name>\`: another agent's machine and test in \`agents/\`, and the config
  lines that serve it.
- \`npx keel machines\`, \`npx keel doctor\`: what Keel loads from this configuration, and why not.
- \`npx keel runs list\`, \`npx keel runs show <id>\`, \`npx keel runs timeline <id>\`: the runs.
- The operator UI: http://127.0.0.1:8080/ui, with a token from \`npx keel admin token\`.
`;
}

function isEmptyOrMissing(dir: string): { ok: true; created: boolean } | { ok: false; entries: string[] } {
  if (!existsSync(dir)) return { ok: true, created: true };
  const entries = readdirSync(dir);
  return entries.length === 0 ? { ok: true, created: false } : { ok: false, entries };
}

/** Writes the project; refuses a directory that is not empty, and leaves nothing behind on a failure. */
export function scaffoldProject(input: ScaffoldProjectInput): ScaffoldProjectResult {
  const dir = resolve(input.dir);
  const { agent } = input;
  if (!AGENT_ID.test(agent)) {
    return {
      ok: false,
      reason: 'invalid_name',
      message: `cannot create project: the agent name "${agent}" is not 1 to 63 lowercase letters, digits, - or _, starting with a letter or digit (it becomes the agent's id and file name)`,
    };
  }
  let state: ReturnType<typeof isEmptyOrMissing>;
  try {
    state = isEmptyOrMissing(dir);
  } catch (error) {
    return { ok: false, reason: 'unwritable', message: `cannot create project in ${dir}: ${(error as Error).message}` };
  }
  if (!state.ok) {
    const shown = state.entries.slice(0, 5).join(', ') + (state.entries.length > 5 ? ', …' : '');
    return { ok: false, reason: 'not_empty', message: `cannot create project in ${dir}: the directory is not empty (${shown}); name a new or empty directory` };
  }
  const name = packageName(dir);
  const planned: Array<[string, string]> = [
    ['package.json', projectPackageJson(name, input)],
    ['keel.config.yaml', projectConfig(agent)],
    [`agents/${agent}.machine.ts`, agentMachineSource(agent)],
    [`agents/${agent}.machine.test.ts`, agentTestSource(agent)],
    ['.gitignore', GITIGNORE],
    ['README.md', projectReadme(name, agent)],
  ];
  const written: string[] = [];
  try {
    for (const [file, text] of planned) {
      const path = join(dir, file);
      mkdirSync(dirname(path), { recursive: true });
      // 'wx' fails on a file another process wrote meanwhile: nothing is overwritten.
      writeFileSync(path, text, { flag: 'wx' });
      written.push(path);
    }
  } catch (error) {
    for (const file of written) rmSync(file, { force: true });
    try {
      rmdirSync(join(dir, 'agents'));
    } catch {
      // Not made, or not empty (another process's files stay).
    }
    if (state.created) rmSync(dir, { recursive: true, force: true });
    return { ok: false, reason: 'unwritable', message: `cannot create project in ${dir}: ${(error as Error).message}` };
  }
  return { ok: true, dir, files: written };
}
