/**
 * `database.url` and `devcloud-bridge migrate`, through `runCli` in this process (as `bridge/main.ts` calls it):
 * the URL is checked and never printed with its password; the commands that work on the bridge's store use
 * PostgreSQL when it is set (docs/scaling.md); and `migrate` brings a real, fresh PostgreSQL database to the
 * schema and says the versions, with the CLI's exit codes.
 */
import { existsSync, rmSync } from 'node:fs';
import { type Server, createServer } from 'node:net';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { runCli } from '../../bridge/cli.js';
import { BridgeConfigSchema, loadBridgeConfig } from '../../bridge/config.js';
import { POSTGRES_MIGRATIONS } from '../../bridge/store/postgres/schema.js';
import { ConfigError } from '../../lib/config.js';
import { safeUrl } from '../../lib/url.js';
import { tempDir } from '../support/agent.js';
import { missingPostgres, usePostgres } from '../support/postgres.js';

const N = POSTGRES_MIGRATIONS.length;

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function dataDir(): string {
  const dir = tempDir('devcloud-bridge-db-');
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** The environment of a clean host: no DEVCLOUD_* variables and no installed config file, plus `extra`. */
function cleanEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  return { PATH: process.env.PATH, HOME: process.env.HOME, CONFIGURATION_DIRECTORY: '/nonexistent', ...extra };
}

async function bridge(args: string[], env: NodeJS.ProcessEnv = {}) {
  let stdout = '';
  let stderr = '';
  const code = await runCli(
    args,
    { out: (s) => (stdout += `${s}\n`), err: (s) => (stderr += `${s}\n`) },
    cleanEnv(env),
  );
  return { code, stdout, stderr };
}

/** A port on which nothing listens (held, then let go). */
async function closedPort(): Promise<number> {
  const server: Server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

describe('database.url', () => {
  it('takes postgres:// and postgresql:// URLs, from the file, DEVCLOUD_DATABASE_URL or --database-url', () => {
    const parse = (url: string) => BridgeConfigSchema.parse({ dataDir: '/d', database: { url } }).database.url;
    expect(parse('postgres://devcloud@db.example.com/devcloud')).toBe('postgres://devcloud@db.example.com/devcloud');
    expect(parse('postgresql://db:5433/x?sslmode=verify-full')).toBe('postgresql://db:5433/x?sslmode=verify-full');
    const fromEnv = loadBridgeConfig({}, cleanEnv({ DEVCLOUD_DATABASE_URL: 'postgres://h/env' }));
    expect(fromEnv.database).toEqual({ url: 'postgres://h/env', poolSize: 10 });
    const fromFlag = loadBridgeConfig(
      { 'database.url': 'postgres://h/flag' },
      cleanEnv({ DEVCLOUD_DATABASE_URL: 'postgres://h/env' }),
    );
    expect(fromFlag.database.url).toBe('postgres://h/flag');
    expect(loadBridgeConfig({}, cleanEnv()).database).toEqual({ poolSize: 10 });
  });

  it('refuses any other URL and a pool size out of range, naming the key, never the password', () => {
    let err: unknown;
    try {
      loadBridgeConfig({ 'database.url': 'mysql://admin:hunter2@db/x' }, cleanEnv());
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as ConfigError).problems).toEqual([
      'database.url: expected a postgres:// or postgresql:// URL, e.g. postgres://devcloud@db.example.com/devcloud ' +
        '(from flag --database-url)',
    ]);
    expect((err as Error).message).not.toContain('hunter2');
    for (const url of ['', 'db.example.com/devcloud', 'postgres:/no-slashes here']) {
      expect(BridgeConfigSchema.safeParse({ dataDir: '/d', database: { url } }).success, url).toBe(false);
    }
    for (const poolSize of [0, 1001, 2.5]) {
      expect(BridgeConfigSchema.safeParse({ dataDir: '/d', database: { poolSize } }).success, `${poolSize}`).toBe(
        false,
      );
    }
  });

  it('the commands that work on the store name an unreachable server, never its password, and exit 1', async () => {
    const dir = dataDir();
    const port = await closedPort();
    const url = ['--database-url', `postgres://devcloud:hunter2@127.0.0.1:${port}/devcloud`, '--data-dir', dir];
    for (const args of [
      ['frontend', 'list'],
      ['firmware', 'list'],
      ['device', 'provision', '--out', dir],
    ]) {
      const r = await bridge([...args, ...url]);
      expect(r.code, args.join(' ')).toBe(1);
      expect(r.stdout).toBe('');
      expect(r.stderr).toContain(`cannot reach the PostgreSQL database at postgres://127.0.0.1:${port}/devcloud`);
      expect(r.stderr).not.toContain('hunter2');
    }
    // Nothing of SQLite's was made on the way.
    expect(existsSync(join(dir, 'bridge.db'))).toBe(false);
    const keys = await bridge(['firmware', 'keygen', '--out', join(dir, 'keys'), ...url]);
    expect(keys.code, keys.stderr).toBe(0);
  });
});

describe('devcloud-bridge migrate: usage', () => {
  it('without database.url, or with an argument, exits 2', async () => {
    const none = await bridge(['migrate']);
    expect(none.code).toBe(2);
    expect(none.stderr).toBe(
      'devcloud-bridge: migrate needs database.url: --database-url URL, DEVCLOUD_DATABASE_URL or the config file\n',
    );
    const extra = await bridge(['migrate', 'now', '--database-url', 'postgres://db/devcloud']);
    expect(extra.code).toBe(2);
    expect(extra.stderr).toBe('devcloud-bridge: migrate takes no arguments, not now\n');
  });

  it('a server that does not answer: exit 1, naming it without the password', async () => {
    const port = await closedPort();
    const r = await bridge(['migrate', '--database-url', `postgres://devcloud:hunter2@127.0.0.1:${port}/devcloud`]);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(
      `devcloud-bridge: cannot reach the PostgreSQL database at postgres://127.0.0.1:${port}/devcloud: ` +
        `connect ECONNREFUSED 127.0.0.1:${port}\n`,
    );
  });
});

describe.skipIf(await missingPostgres())('devcloud-bridge migrate on a fresh database', () => {
  const db = usePostgres();

  it('the store commands work on PostgreSQL, migrating it first, and leave no SQLite file in dataDir', async () => {
    await db.reset();
    const dir = dataDir();
    const url = ['--database-url', db.url, '--data-dir', dir];
    const created = await bridge(['frontend', 'create', '--name', 'acme', ...url]);
    expect(created.code, created.stderr).toBe(0);
    const id = created.stdout.trim();
    const list = await bridge(['frontend', 'list', '--json', ...url]);
    expect(list.code, list.stderr).toBe(0);
    const frontends = JSON.parse(list.stdout) as Array<{ id: string; name: string; isDefault: boolean }>;
    expect(frontends.map((f) => f.name).sort()).toEqual(['acme', 'default']);
    expect(frontends.find((f) => f.id === id)?.isDefault).toBe(false);
    const rows = await db.pool.query<{ name: string }>('SELECT name FROM frontends ORDER BY name');
    expect(rows.rows.map((r) => r.name)).toEqual(['acme', 'default']);
    const fw = await bridge(['firmware', 'list', '--json', ...url]);
    expect(fw.code, fw.stderr).toBe(0);
    expect(JSON.parse(fw.stdout)).toEqual([]);
    expect(existsSync(join(dir, 'bridge.db'))).toBe(false);
  });

  it('applies the migrations and says the versions before and after; a second run has nothing to do', async () => {
    await db.reset();
    const first = await bridge(['migrate', '--database-url', db.url]);
    expect(first.stderr).toBe('');
    expect(first.code).toBe(0);
    const applied = N === 1 ? '1 migration applied' : `${N} migrations applied`;
    expect(first.stdout).toBe(`${safeUrl(db.url)}: schema version 0 -> ${N} (${applied})\n`);
    expect(first.stdout).not.toContain('@');
    const again = await bridge(['migrate', '--json'], { DEVCLOUD_DATABASE_URL: db.url });
    expect(again.code).toBe(0);
    expect(JSON.parse(again.stdout)).toEqual({ url: safeUrl(db.url), before: N, after: N });
    const rows = await db.pool.query('SELECT version FROM schema_migrations');
    expect(rows.rowCount).toBe(N);
  });

  it('a password in the URL is never printed', async () => {
    await db.reset();
    const url = new URL(db.url);
    url.password = 'hunter2';
    const r = await bridge(['migrate', '--database-url', url.toString()]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout + r.stderr).not.toContain('hunter2');
    expect(r.stdout).toContain(`schema version 0 -> ${N}`);
  });

  it('a database newer than the program: exit 1 with the reason, and nothing changed', async () => {
    await db.reset();
    expect((await bridge(['migrate', '--database-url', db.url])).code).toBe(0);
    await db.pool.query("INSERT INTO schema_migrations (version, name) VALUES ($1, 'from the future')", [N + 1]);
    const r = await bridge(['migrate', '--database-url', db.url]);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(
      `devcloud-bridge: PostgreSQL schema version ${N + 1} is newer than this program knows (${N}); refusing to run: ` +
        'use a devcloud-bridge at least as new as the one that migrated it\n',
    );
    const rows = await db.pool.query('SELECT version FROM schema_migrations');
    expect(rows.rowCount).toBe(N + 1);
  });
});
