/**
 * A failure injected at every active state of the firmware update (docs/decisions.md §7), in the manner of the
 * Mender client's state tests: one table, a row per state, each row run end to end through a live bridge
 * (REST start, the image over HTTP behind the job's token, `meta` over MQTT) and a real in-process agent with
 * its own state directory and slots. Each row checks the `fwstate` sequence the bridge recorded, the final state,
 * `fwerror` and its code `fwerrorcode`, the slot that ends active and the `fwversion` the bridge shows.
 */
import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../../agent/cli/index.js';
import { activeSlot } from '../../agent/fw/slots.js';
import type { FwFailureCode } from '../../protocol/index.js';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type SigningKeys, addToCatalog, buildImage, fwStates, makeKeys, metaOf } from '../support/firmware.js';
import { until } from '../support/wait.js';

/** The version the gateways run before the update, and the one every image brings. */
const OLD = '1';
const NEW = 2;

/** What a row sets up before the update starts, in the row's own directory. */
interface Injection {
  /** Agent config over the defaults (slots installer, health command `true`, no restart). */
  flags?: Record<string, unknown>;
  /** The image's install script. */
  install?: string;
  /** Sign the catalog entry with this key instead of the one the agent knows. */
  signWith?: string;
}

interface Ctx {
  dir: string;
  name: string;
  live: LiveBridge;
  /** The command installer written for this row (see `commandInstaller`). */
  installer: CommandInstaller;
}

interface Row {
  /** The state the failure is injected at; `none` for the update that succeeds. */
  at: string;
  inject: (ctx: Ctx) => Injection;
  /** After the failure has settled: what an engineer does (the rollingback row), before the final checks. */
  recover?: (ctx: Ctx, agent: TestAgent) => Promise<void>;
  states: string[];
  final: string;
  /** What `fwerror` must say at the end; `undefined`: empty. */
  error: RegExp | undefined;
  /** What `fwerrorcode` must be at the end (docs/firmware.md, "Failure codes"); empty with no error. */
  code: FwFailureCode | '';
  /** The slot that ends active. */
  slot: 'a' | 'b';
  fwversion: string;
  /** The command installer's calls, in order, when the row uses it. */
  calls?: string[];
}

const BEFORE_SWITCH = ['idle', 'downloading', 'verifying', 'installing'];
const TO_COMMIT = [...BEFORE_SWITCH, 'switching', 'restarting', 'committing'];

/**
 * A stand-in for RAUC or SWUpdate: records each call, keeps the active slot in `active`, and fails an action
 * while a file `fail-<action>` exists.
 */
interface CommandInstaller {
  script: string;
  calls(): string[];
  active(): string;
  failOn(action: string): void;
  heal(action: string): void;
}

function commandInstaller(dir: string): CommandInstaller {
  const home = join(dir, 'installer');
  mkdirSync(home, { recursive: true });
  const script = join(home, 'fw-install');
  writeFileSync(
    script,
    `#!/bin/sh
home="${home}"
echo "$1" >> "$home/calls"
if [ -e "$home/fail-$1" ]; then echo "$1 refused by the test" >&2; exit 7; fi
case "$1" in
  install) [ -f "$2" ] || exit 9; echo b > "$home/pending" ;;
  switch) cp "$home/pending" "$home/active" ;;
  rollback) echo a > "$home/active" ;;
esac
`,
  );
  chmodSync(script, 0o755);
  writeFileSync(join(home, 'active'), 'a\n');
  const read = (f: string): string => (existsSync(join(home, f)) ? readFileSync(join(home, f), 'utf8') : '');
  return {
    script,
    calls: () => read('calls').split('\n').filter(Boolean),
    active: () => read('active').trim(),
    failOn: (action) => writeFileSync(join(home, `fail-${action}`), ''),
    heal: (action) => rmSync(join(home, `fail-${action}`)),
  };
}

const command = (ctx: Ctx, extra: Record<string, unknown> = {}): Record<string, unknown> => ({
  'firmware.installer': 'command',
  'firmware.installCommand': [ctx.installer.script],
  ...extra,
});

const ROWS: Row[] = [
  {
    at: 'downloading',
    // The job's token no longer opens the image: the bridge answers 401, which asking again cannot change.
    inject: (ctx) => {
      const db = new Database(join(ctx.live.dataDir, 'bridge.db'));
      db.pragma('busy_timeout = 5000');
      db.exec(`CREATE TRIGGER revoke_token AFTER INSERT ON fw_jobs WHEN NEW.name = '${ctx.name}'
               BEGIN UPDATE fw_jobs SET token_hash = 'revoked' WHERE id = NEW.id; END`);
      db.close();
      return {};
    },
    states: ['idle', 'downloading', 'failed'],
    final: 'failed',
    error: /download: the server answered 401/,
    code: 'download-denied',
    slot: 'a',
    fwversion: OLD,
  },
  {
    at: 'verifying',
    inject: () => ({ signWith: makeKeys().privatePem }),
    states: ['idle', 'downloading', 'verifying', 'failed'],
    final: 'failed',
    error: /verify \(signature\)/,
    code: 'signature',
    slot: 'a',
    fwversion: OLD,
  },
  {
    at: 'installing',
    inject: () => ({ install: 'echo "no space left" >&2; exit 3' }),
    states: [...BEFORE_SWITCH, 'failed'],
    final: 'failed',
    error: /install \(script-failed\).*exit status 3: no space left/,
    code: 'script-failed',
    slot: 'a',
    fwversion: OLD,
  },
  {
    at: 'switching',
    inject: (ctx) => {
      ctx.installer.failOn('switch');
      return { flags: command(ctx) };
    },
    states: [...BEFORE_SWITCH, 'switching', 'rollingback', 'rolledback'],
    final: 'rolledback',
    error: /switch: .*fw-install failed \(exit status 7: switch refused by the test\)/,
    code: 'switch',
    slot: 'a',
    fwversion: OLD,
    calls: ['install', 'switch', 'rollback'],
  },
  {
    at: 'restarting',
    inject: () => ({
      flags: {
        'firmware.restart': 'command',
        'firmware.restartCommand': ['sh', '-c', 'echo "service did not start" >&2; exit 5'],
      },
    }),
    states: [...BEFORE_SWITCH, 'switching', 'restarting', 'rollingback', 'rolledback'],
    final: 'rolledback',
    error: /restart: sh failed \(exit status 5: service did not start\)/,
    code: 'restart',
    slot: 'a',
    fwversion: OLD,
  },
  {
    at: 'committing',
    inject: () => ({
      flags: {
        'firmware.health.command': ['sh', '-c', 'echo "probe refused" >&2; exit 1'],
        'firmware.health.retries': 0,
      },
    }),
    states: [...TO_COMMIT, 'rollingback', 'rolledback'],
    final: 'rolledback',
    error: /health check failed after 1 attempt\(s\): .*exited with status 1: probe refused/,
    code: 'health',
    slot: 'a',
    fwversion: OLD,
  },
  {
    at: 'rollingback',
    // The health check fails, then the rollback too: the job stays in rollingback, saying why, until it is retried.
    inject: (ctx) => {
      ctx.installer.failOn('rollback');
      return { flags: command(ctx, { 'firmware.health.command': ['false'], 'firmware.health.retries': 0 }) };
    },
    recover: async (ctx, agent) => {
      const id = agent.agent.identity.deviceId;
      const store = ctx.live.bridge.store;
      await until(
        async () =>
          (await metaOf(store, id, 'fwstate')) === 'rollingback' &&
          /rollback: .*exit status 7/.test((await metaOf(store, id, 'fwerror')) ?? ''),
        'the failed rollback reported',
      );
      // While it waits, the code names what failed last: the rollback, not the health check before it.
      expect(await metaOf(store, id, 'fwerrorcode')).toBe('rollback');
      // Stuck, not abandoned: the slot is still the new one, and the state says rollingback.
      expect(ctx.installer.active()).toBe('b');
      expect(agent.agent.firmware.status().state).toBe('rollingback');
      // The engineer removes the cause and runs `devcloud-agent fw rollback` (through the agent's socket).
      ctx.installer.heal('rollback');
      const out: string[] = [];
      const err: string[] = [];
      const code = await runCli(
        ['fw', 'rollback', '--json', '--state-dir', agent.config.stateDir],
        { out: (s) => out.push(s), err: (s) => err.push(s) },
        {},
      );
      expect([code, err]).toEqual([0, []]);
      // The agent took the rollback on: it answers with the job moved back into rollingback, retrying.
      expect(JSON.parse(out.join('\n'))).toMatchObject({ state: 'rollingback' });
      // The job's steps keep both: why it rolled back, and the rollback that failed.
      const status = agent.agent.firmware.status() as { job: { steps: Array<{ state: string; error: string }> } };
      expect(status.job.steps).toContainEqual(
        expect.objectContaining({
          state: 'rollingback',
          error: expect.stringMatching(/^health check failed/),
          errorCode: 'health',
        }),
      );
      expect(status.job.steps).toContainEqual(
        expect.objectContaining({
          state: 'rollingback',
          error: expect.stringMatching(/^rollback: .*exit status 7/),
          errorCode: 'rollback',
        }),
      );
    },
    states: [...TO_COMMIT, 'rollingback', 'rolledback'],
    final: 'rolledback',
    // `rolledback` reports why the update was rolled back, not the failed attempt at rolling back.
    error: /^health check failed after 1 attempt/,
    code: 'health',
    slot: 'a',
    fwversion: OLD,
    calls: ['install', 'switch', 'rollback', 'rollback'],
  },
  {
    at: 'none',
    inject: () => ({}),
    states: [...TO_COMMIT, 'done'],
    final: 'done',
    error: undefined,
    code: '',
    slot: 'b',
    fwversion: String(NEW),
  },
];

describe('a failure at every state of the firmware update', () => {
  let live: LiveBridge;
  let http: HttpClient;
  let keys: SigningKeys;
  const agents: TestAgent[] = [];

  beforeAll(async () => {
    live = await startLiveBridge();
    keys = makeKeys();
    http = live.client();
    const r = await http.post('/0/session/signup', {
      form: { login: 'fw-states@example.com', password: 'correct horse battery' },
    });
    expect(r.status).toBeLessThan(400);
  });

  afterAll(async () => {
    for (const a of agents) await a.stop();
    await live?.close();
  });

  it.each(ROWS)('at $at', async (row) => {
    const dir = tempDir('devcloud-fw-states-');
    const name = `fw-states/${row.at}`;
    const ctx: Ctx = { dir, name, live, installer: commandInstaller(dir) };
    const inj = row.inject(ctx);

    // The old image runs in slot a.
    const slotsDir = join(dir, 'slots');
    mkdirSync(join(slotsDir, 'a'), { recursive: true });
    writeFileSync(join(slotsDir, 'a', 'version'), OLD);

    const image = buildImage(
      { name, version: NEW, files: { version: String(NEW) }, ...(inj.install ? { install: inj.install } : {}) },
      dir,
    );
    const store = live.bridge.store;
    await addToCatalog(store, image, { name, version: NEW, ...(inj.signWith ? { signWith: inj.signWith } : {}) }, keys);

    const agent = await startAgent({
      mqttUrl: live.mqttUrl,
      stateDir: join(dir, 'state'),
      level: 'info',
      flags: {
        platform: 'linux-x64',
        fwVersion: OLD,
        'firmware.publicKeys': [keys.publicFile],
        'firmware.slotsDir': slotsDir,
        'firmware.health.command': ['true'],
        ...inj.flags,
      },
    });
    agents.push(agent);
    const id = agent.agent.identity.deviceId;
    await until(() => store.devices.deviceByAuthcode(agent.agent.identity.authcode), 'the agent hello');
    const claim = await http.post('/0/devices/', { form: { auth: agent.agent.identity.authcode } });
    expect([claim.status, claim.body]).toEqual([201, id]);
    await agent.agent.vars.set('d', 'mode', Buffer.from('connected'));
    await until(async () => (await store.devices.getVar(id, 'd', 'mode'))?.acked, 'mode connected at the bridge');
    await until(async () => (await metaOf(store, id, 'fwstate')) === 'idle', 'fwstate idle at the bridge');

    const r = await http.post(`/0/devices/${id}/fw/${name}`);
    expect([r.status, r.body]).toEqual([200, 'device-ok']);

    if (row.recover) await row.recover(ctx, agent);
    await until(async () => (await metaOf(store, id, 'fwstate')) === row.final, `fwstate ${row.final}`);
    // The job is over on both sides: the bridge records the outcome, the agent saved the same final state.
    await until(async () => (await store.fwJobs.openOf(id)) === undefined, 'the job ended at the bridge');

    expect(await fwStates(store, id)).toEqual(row.states);
    const fwerror = (await metaOf(store, id, 'fwerror')) ?? '';
    if (row.error) expect(fwerror).toMatch(row.error);
    else expect(fwerror).toBe('');
    // The code travels beside the text, on up/meta to the bridge's `meta` variable.
    expect(await metaOf(store, id, 'fwerrorcode')).toBe(row.code);
    expect(agent.agent.firmware.status()).toMatchObject({ job: { errorCode: row.code } });
    expect(await metaOf(store, id, 'fwversion')).toBe(row.fwversion);
    expect(await metaOf(store, id, 'fwname')).toBe(name);

    if (inj.flags?.['firmware.installer'] === 'command') {
      expect(ctx.installer.active()).toBe(row.slot);
      expect(ctx.installer.calls()).toEqual(row.calls);
    } else {
      expect(await activeSlot(slotsDir)).toBe(row.slot);
      // What runs is the image of that slot.
      const running = existsSync(join(slotsDir, 'current')) ? join(slotsDir, 'current') : join(slotsDir, 'a');
      expect(readFileSync(join(running, 'version'), 'utf8')).toBe(row.slot === 'a' ? OLD : String(NEW));
    }
    await agent.stop();
  });
});
