/**
 * A `kill -9` of the agent at every active state of the firmware update (docs/decisions.md §7), in the manner of the
 * Mender client's state tests: one table, a row per state. Each row runs a real agent process against a live
 * bridge (REST start, the image over HTTP through a proxy, `meta` over the embedded broker), holds the agent in
 * the row's state with a program that writes a marker and blocks, kills the agent there, starts it again on the
 * same state directory, and checks the `fwstate` sequence the bridge recorded, the final state and the slot that
 * ends active: the old one unless the update got through a passing health check.
 */
import { execFileSync } from 'node:child_process';
import {
  chmodSync,
  closeSync,
  constants,
  existsSync,
  mkdirSync,
  openSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { activeSlot } from '../../agent/fw/slots.js';
import { type AgentProcess, spawnAgent, tempDir, waitForSocket } from '../support/agent.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type SigningKeys, addToCatalog, buildImage, fwStates, makeKeys, metaOf } from '../support/firmware.js';
import { type FwProxy, startFwProxy } from '../support/fw-proxy.js';
import { until } from '../support/wait.js';

const NAME = 'states/kill';
/** Bytes the proxy lets through before it stalls the first download. */
const STALL_AT = 32 * 1024;

const DONE = ['idle', 'downloading', 'verifying', 'installing', 'switching', 'restarting', 'committing', 'done'];
const ROLLED_BACK = [...DONE.slice(0, -1), 'rollingback', 'rolledback'];

/**
 * One program stands in for everything the updater runs, called as `fwt ROLE [ARGS]`: the image's install
 * script (`install`), the command installer (`installer ACTION [IMAGE]`), the health check (`health`) and the
 * restart command (`restart`). It records each step in `$FWT_WORK/calls`; a step named in FWT_HOLD is held for
 * its first FWT_TIMES calls (a marker `held-STEP-N` with its pid, then it waits until the row's folder is gone);
 * a step named in FWT_FAIL fails. As the command installer it keeps the active slot in `$FWT_WORK/active`.
 */
const FWT = `#!/bin/sh
W="$FWT_WORK"
if [ "$1" = installer ]; then step="$2"; else step="$1"; fi
echo "$step" >> "$W/calls"
n=$(grep -cx "$step" "$W/calls")
case " \${FWT_HOLD:-} " in *" $step "*)
  if [ "$n" -le "\${FWT_TIMES:-1}" ]; then
    echo $$ > "$W/.held" && mv "$W/.held" "$W/held-$step-$n"
    while [ -d "$W" ]; do sleep 0.05; done
    exit 1
  fi ;;
esac
case " \${FWT_FAIL:-} " in *" $step "*) exit 1 ;; esac
if [ "$1" = installer ]; then
  active=$(cat "$W/active")
  case "$2" in
    install) if [ "$active" = a ]; then echo b; else echo a; fi > "$W/target" ;;
    switch) target=$(cat "$W/target")
      if [ "$active" != "$target" ]; then echo "$active" > "$W/previous"; echo "$target" > "$W/active"; fi ;;
    rollback) if [ -f "$W/previous" ]; then cp "$W/previous" "$W/active"; fi ;;
  esac
fi
exit 0
`;

interface Ctx {
  work: string;
  stateDir: string;
  /** Where the row's agent reads its public key (a FIFO in the verifying row). */
  keyFile: string;
  /** The proxy's requests from before this row started are not the row's. */
  firstRequest: number;
}

interface Row {
  /** The state the agent is killed in. */
  state: string;
  /** What the row is about, after the state. */
  title: string;
  /** `firmware` config over the defaults (slots installer, health `fwt health` without retries, no restart). */
  firmware?: Record<string, unknown>;
  /** The step `fwt` holds, how many times, and the one it fails. */
  hold?: string;
  times?: number;
  fail?: string;
  /** The public key file is a FIFO, so that reading it blocks. */
  keyFifo?: boolean;
  /** Kills in a row, each in `state` (the loop counter's row kills more than once). */
  kills?: number;
  /** Before the update starts (the download row plans the stall). */
  arm?: (ctx: Ctx) => void;
  /** Resolves when the agent is held in `state` for the `n`th time (default: the `fwt` marker). */
  held?: (ctx: Ctx, n: number) => Promise<void>;
  /** After the kill, before the next start. */
  between?: (ctx: Ctx) => void;
  states: string[];
  final: 'done' | 'rolledback';
  /** What `fwerror` says at the end; `undefined`: not checked. */
  error?: RegExp;
  /** The steps `fwt` recorded, in order. */
  calls: string[];
  /** More checks at the end. */
  check?: (ctx: Ctx) => void;
}

let live: LiveBridge;
let proxy: FwProxy;
let http: HttpClient;
let keys: SigningKeys;
const root = tempDir('devcloud-fw-kill-');
const fwt = join(root, 'fwt');

/** The first `.part` file of the row's agent, once it exists. */
function partFile(ctx: Ctx): string | undefined {
  const dir = join(ctx.stateDir, 'fw');
  const name = existsSync(dir) ? readdirSync(dir).find((f) => f.endsWith('.part')) : undefined;
  return name === undefined ? undefined : join(dir, name);
}

/** A FIFO opened for writing without blocking has a reader exactly when the agent is blocked reading it. */
let fifoWriter: number | undefined;
function fifoReaderWaiting(path: string): boolean {
  try {
    // Kept open, so that the reader waits for data instead of reading an end of file.
    fifoWriter = openSync(path, constants.O_WRONLY | constants.O_NONBLOCK);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENXIO') return false;
    throw err;
  }
}

const command = (extra: Record<string, unknown> = {}): Record<string, unknown> => ({
  installer: 'command',
  installCommand: [fwt, 'installer'],
  ...extra,
});

const ROWS: Row[] = [
  {
    state: 'downloading',
    title: 'the download resumes from the bytes on disk',
    arm: () => proxy.plan({ kind: 'stall', after: STALL_AT }),
    held: (ctx) =>
      until(() => {
        const part = partFile(ctx);
        return part !== undefined && statSync(part).size === STALL_AT;
      }, 'the first bytes on disk').then(() => undefined),
    states: DONE,
    final: 'done',
    calls: ['install', 'health'],
    check: (ctx) => {
      // An attempt the bridge refused (the token it replaced when the agent said hello again) fetched nothing.
      const reqs = proxy.requests.slice(ctx.firstRequest).filter((r) => r.status !== 401 || r.bytes > 0);
      const size = statSync(join(root, 'image.tar.gz')).size;
      expect(reqs.map((r) => [r.range, r.status, r.bytes])).toEqual([
        [undefined, 200, STALL_AT],
        [`bytes=${STALL_AT}-`, 206, size - STALL_AT],
      ]);
    },
  },
  {
    state: 'verifying',
    title: 'verification starts again with the key readable',
    keyFifo: true,
    held: (ctx) => until(() => fifoReaderWaiting(ctx.keyFile), 'the agent reading the key').then(() => undefined),
    between: (ctx) => {
      if (fifoWriter !== undefined) closeSync(fifoWriter);
      fifoWriter = undefined;
      unlinkSync(ctx.keyFile);
      writeFileSync(ctx.keyFile, readFileSync(keys.publicFile));
    },
    states: DONE,
    final: 'done',
    calls: ['install', 'health'],
  },
  {
    state: 'installing',
    title: 'the image is installed again into the inactive slot',
    hold: 'install',
    states: DONE,
    final: 'done',
    calls: ['install', 'install', 'health'],
  },
  {
    state: 'switching',
    title: 'the command installer switches again and commits',
    firmware: command(),
    hold: 'switch',
    states: DONE,
    final: 'done',
    calls: ['install', 'switch', 'switch', 'health', 'commit'],
  },
  {
    state: 'restarting',
    title: 'the restart command runs again',
    firmware: { restart: 'command', restartCommand: [fwt, 'restart'] },
    hold: 'restart',
    states: DONE,
    final: 'done',
    calls: ['install', 'restart', 'restart', 'health'],
  },
  {
    state: 'committing',
    title: 'the health check runs again and passes',
    hold: 'health',
    states: DONE,
    final: 'done',
    calls: ['install', 'health', 'health'],
  },
  {
    state: 'rollingback',
    title: 'the command installer rolls back again',
    firmware: command(),
    fail: 'health',
    hold: 'rollback',
    states: ROLLED_BACK,
    final: 'rolledback',
    calls: ['install', 'switch', 'health', 'rollback', 'rollback'],
  },
  {
    state: 'committing',
    title: 'killed at every start up to maxAttempts: rolled back at the next start',
    firmware: { maxAttempts: 2 },
    hold: 'health',
    times: 2,
    kills: 2,
    states: ROLLED_BACK,
    final: 'rolledback',
    error: /gave up after 2 starts of the agent in state committing/,
    calls: ['install', 'health', 'health'],
  },
];

beforeAll(async () => {
  writeFileSync(fwt, FWT);
  chmodSync(fwt, 0o755);
  keys = makeKeys(root);
  proxy = await startFwProxy();
  live = await startLiveBridge({ config: { firmware: { baseUrl: proxy.url } } });
  proxy.target = live.url;
  // Random bytes, so that the image is larger than where the proxy stalls the download.
  const image = buildImage(
    { name: NAME, version: 2, files: { 'app.bin': randomBytes(128 * 1024) }, install: 'exec "$FWT_SH" install' },
    root,
  );
  await addToCatalog(live.bridge.store, image, { name: NAME, version: 2 }, keys);
  http = live.client();
  const signup = await http.post('/0/session/signup', {
    form: { login: 'fw-kill@example.com', password: 'correct horse battery' },
  });
  expect(signup.status).toBe(201);
});

afterAll(async () => {
  await live?.close();
  await proxy?.close();
  rmSync(root, { recursive: true, force: true });
});

const procs: AgentProcess[] = [];
const cleanups: Array<() => void> = [];
afterEach(async () => {
  for (const p of procs.splice(0)) await p.kill9();
  for (const c of cleanups.splice(0)) c();
});

/** Ends the held programs the killed agents left behind (each leads its own process group). */
function releaseHeld(work: string): void {
  for (const f of existsSync(work) ? readdirSync(work) : []) {
    if (!f.startsWith('held-')) continue;
    const pid = Number(readFileSync(join(work, f), 'utf8'));
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // Already gone.
    }
  }
  rmSync(work, { recursive: true, force: true });
}

describe('kill -9 of the agent in each firmware state, then a restart on the same state directory', () => {
  it.each(ROWS.map((r) => [`${r.state}: ${r.title}`, r] as const))('%s', async (_title, row) => {
    const work = join(root, `row-${randomBytes(4).toString('hex')}`);
    mkdirSync(work);
    writeFileSync(join(work, 'active'), 'a\n');
    const stateDir = tempDir('devcloud-fw-kill-agent-');
    cleanups.push(() => {
      if (fifoWriter !== undefined) closeSync(fifoWriter);
      fifoWriter = undefined;
      releaseHeld(work);
      rmSync(stateDir, { recursive: true, force: true });
    });
    const keyFile = join(work, 'signing.pub');
    if (row.keyFifo) execFileSync('mkfifo', [keyFile]);
    else writeFileSync(keyFile, readFileSync(keys.publicFile));
    const ctx: Ctx = { work, stateDir, keyFile, firstRequest: proxy.requests.length };

    const config = join(work, 'agent.yaml');
    writeFileSync(
      config,
      JSON.stringify({
        mqtt: { backoffMinMs: 50, backoffMaxMs: 500 },
        firmware: {
          publicKeys: [keyFile],
          health: { command: [fwt, 'health'], retries: 0, intervalMs: 0 },
          ...row.firmware,
        },
      }),
    );
    const args = [
      '--state-dir',
      stateDir,
      '--mqtt-url',
      live.mqttUrl,
      '--udp-port',
      '0',
      '--platform',
      'linux-x64',
      '--fw-version',
      '1',
      '--log-pretty',
      'never',
      '--config',
      config,
    ];
    const env = {
      CONFIGURATION_DIRECTORY: work,
      FWT_WORK: work,
      FWT_SH: fwt,
      FWT_HOLD: row.hold ?? '',
      FWT_TIMES: String(row.times ?? 1),
      FWT_FAIL: row.fail ?? '',
    };
    const spawn = async (): Promise<AgentProcess> => {
      const p = spawnAgent(args, env);
      procs.push(p);
      (await waitForSocket(p.socket)).close();
      return p;
    };
    const store = live.bridge.store;

    let agent = await spawn();
    const client = await waitForSocket(agent.socket);
    const { deviceId: id } = await client.status<{ deviceId: string }>();
    const authcode = await until(async () => (await store.devices.device(id))?.authcode ?? undefined, 'the hello');
    const claim = await http.post('/0/devices/', { form: { auth: authcode } });
    expect([claim.status, claim.body]).toEqual([201, id]);
    await client.set('d', 'mode', 'connected');
    client.close();
    await until(async () => (await store.devices.getVar(id, 'd', 'mode'))?.acked, 'mode connected on the bridge');

    row.arm?.(ctx);
    const start = await http.post(`/0/devices/${id}/fw/${NAME}`);
    expect([start.status, start.body]).toEqual([200, 'device-ok']);

    const kills = row.kills ?? 1;
    for (let n = 1; n <= kills; n++) {
      await (row.held ?? ((c: Ctx, k: number) => heldBy(c, row.hold!, k)))(ctx, n);
      // The bridge has the state too, so the sequence it recorded is the one the agent went through.
      await until(async () => (await metaOf(store, id, 'fwstate')) === row.state, `fwstate ${row.state} on the bridge`);
      await agent.kill9();
      row.between?.(ctx);
      agent = await spawn();
    }

    const final = await until(async () => {
      const s = await metaOf(store, id, 'fwstate');
      return s === 'done' || s === 'rolledback' || s === 'failed' ? s : undefined;
    }, 'a final state');
    expect(final, await metaOf(store, id, 'fwerror')).toBe(row.final);
    expect(await fwStates(store, id)).toEqual(row.states);
    const updated = row.final === 'done';
    const slot =
      row.firmware?.installer === 'command'
        ? readFileSync(join(work, 'active'), 'utf8').trim()
        : await activeSlot(join(stateDir, 'slots'));
    expect(slot).toBe(updated ? 'b' : 'a');
    await until(
      async () => (await metaOf(store, id, 'fwversion')) === (updated ? '2' : '1'),
      'fwversion on the bridge',
    );
    if (row.error) expect(await metaOf(store, id, 'fwerror')).toMatch(row.error);
    expect(readFileSync(join(work, 'calls'), 'utf8').split('\n').filter(Boolean)).toEqual(row.calls);
    row.check?.(ctx);
  });
});

/** Waits for the marker of the `n`th held call of `step`. */
async function heldBy(ctx: Ctx, step: string, n: number): Promise<void> {
  await until(() => existsSync(join(ctx.work, `held-${step}-${n}`)), `${step} held (${n})`);
}
