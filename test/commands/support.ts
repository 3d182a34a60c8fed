/**
 * What the command tests share: a claimed device behind a listening bridge (its embedded broker, or a private
 * Mosquitto with per-device credentials), a real agent with a folder of handler scripts, and helpers to post
 * commands and wait for their states.
 *
 * The handler scripts write what they saw into the rig's work folder:
 * - `rec WORDS`: appends WORDS to `runs.log`;
 * - `block NAME`: appends NAME to `runs.log`, then waits until the file `release-NAME` (or `release-all`) exists;
 * - `bin ...`: copies its stdin to `stdin.bin` and `DEVCLOUD_COMMAND64` to `env64`;
 * - `hang`: starts a `sleep 1000` in the background, writes its pid to `child.pid`, and waits for it;
 * - `big`: prints the numbers 1 to 3000, one a line (13,893 bytes);
 * - `utf`: prints 2000 `€` (6,000 bytes, three to a character).
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { expect } from 'vitest';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import {
  type ConfigOverrides,
  type HttpClient,
  type HttpResult,
  type LiveBridge,
  startLiveBridge,
} from '../support/bridge.js';
import { type SecureMosquitto, startSecureMosquitto } from '../support/brokers.js';
import { until } from '../support/wait.js';

export { until };

/** A command as `GET /0/devices/<id>/commands/<uuid>` shows it. */
export interface Cmd {
  id: string;
  command?: string;
  command64?: string;
  priority: number;
  state: string;
  created: number;
  expires: number;
  sent: number | null;
  delivered: number | null;
  started: number | null;
  finished: number | null;
  exitCode: number | null;
  signal: string | null;
  output: string | null;
  truncated: boolean;
  reason: string | null;
}

export const FINAL_STATES = ['done', 'failed', 'expired'];

/** Writes the test handlers into `handlers`; what they record goes to `work`. */
export function writeHandlers(handlers: string, work: string): void {
  mkdirSync(handlers, { recursive: true });
  const scripts: Record<string, string> = {
    rec: `printf '%s\\n' "$*" >> "$W/runs.log"`,
    block: [
      `printf '%s\\n' "$1" >> "$W/runs.log"`,
      // Let go by its own file or by \`release-all\`; a removed work folder ends it too.
      `while [ -d "$W" ] && [ ! -e "$W/release-$1" ] && [ ! -e "$W/release-all" ]; do sleep 0.02; done`,
      `echo "released $1"`,
    ].join('\n'),
    bin: [`cat > "$W/stdin.bin"`, `printf '%s' "$DEVCLOUD_COMMAND64" > "$W/env64"`].join('\n'),
    hang: [`sleep 1000 &`, `echo $! > "$W/child.pid"`, `wait`].join('\n'),
    // Writes its file after a delay, unless it is killed first; its pid and its child's are in the work folder.
    slow: [
      `echo $$ > "$W/slow.pid"`,
      `sleep "$1" &`,
      `echo $! > "$W/slow-child.pid"`,
      `wait`,
      `echo ran > "$W/slow.out"`,
    ].join('\n'),
    big: `seq 1 3000`,
    utf: `i=0; while [ $i -lt 2000 ]; do printf '€'; i=$((i+1)); done`,
  };
  for (const [name, body] of Object.entries(scripts)) {
    const file = join(handlers, name);
    writeFileSync(file, `#!/bin/sh\nW='${work}'\n${body}\n`);
    chmodSync(file, 0o755);
  }
}

/** The lines of `runs.log` in a work folder: what ran, in order. */
export function runsIn(work: string): string[] {
  const file = join(work, 'runs.log');
  return existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter(Boolean) : [];
}

/** An identity made ahead, as provisioning would make it, so that Mosquitto knows the device before it runs. */
export function newIdentity(): { deviceId: string; secret: string; authcode: string } {
  return { deviceId: randomUUID(), secret: randomBytes(32).toString('hex'), authcode: randomBytes(16).toString('hex') };
}

export interface RigOptions {
  broker?: 'embedded' | 'mosquitto';
  /** Agent config over the rig's defaults (the handlers folder, a 30 s timeout). */
  agentFlags?: Record<string, unknown>;
  bridgeConfig?: ConfigOverrides;
}

export interface Rig {
  bridge: LiveBridge;
  mosquitto: SecureMosquitto | undefined;
  /** The running agent; `undefined` between `stopAgent()` and `startAgent()`. */
  agent: TestAgent | undefined;
  /** The owner's session. */
  http: HttpClient;
  deviceId: string;
  /** Where the handlers record what they saw. */
  work: string;
  handlers: string;
  post(form: Record<string, string>): Promise<HttpResult>;
  /** Posts a command and expects 200; resolves to its uuid. */
  send(command: string, extra?: Record<string, string>): Promise<string>;
  get(cmd: string): Promise<Cmd>;
  /** Waits until the command is in a final state on the bridge. */
  finished(cmd: string, ms?: number): Promise<Cmd>;
  /** Waits until the device reported the command queued (the agent has it stored). */
  delivered(cmd: string): Promise<Cmd>;
  /** The lines of `runs.log`: what ran, in order. */
  runs(): string[];
  release(name: string): void;
  metaState(): Promise<string | undefined>;
  stopAgent(): Promise<void>;
  startAgent(): Promise<TestAgent>;
  close(): Promise<void>;
}

const BRIDGE_LOGIN = { username: 'devcloud-bridge', password: randomBytes(24).toString('hex') };

export async function startRig(opts: RigOptions = {}): Promise<Rig> {
  const cleanups: Array<() => Promise<void> | void> = [];
  const work = tempDir('devcloud-cmd-work-');
  cleanups.push(() => rmSync(work, { recursive: true, force: true }));
  const handlers = join(work, 'handlers');
  writeHandlers(handlers, work);
  const agentState = tempDir('devcloud-cmd-agent-');
  cleanups.push(() => rmSync(agentState, { recursive: true, force: true }));

  let mosquitto: SecureMosquitto | undefined;
  const flags: Record<string, unknown> = { 'commands.dir': handlers, 'commands.timeoutMs': 30_000 };
  let bridgeConfig = opts.bridgeConfig ?? {};
  if (opts.broker === 'mosquitto') {
    const identity = newIdentity();
    const broker = await startSecureMosquitto({
      devices: [{ id: identity.deviceId, secret: identity.secret }],
      bridge: BRIDGE_LOGIN,
    });
    mosquitto = broker;
    cleanups.push(() => broker.close());
    const provisioningFile = join(work, 'provision.json');
    writeFileSync(provisioningFile, JSON.stringify(identity), { mode: 0o600 });
    flags['identity.provisioningFile'] = provisioningFile;
    bridgeConfig = {
      ...bridgeConfig,
      mqtt: { url: broker.url, username: BRIDGE_LOGIN.username, passwordFile: broker.bridgePasswordFile },
    };
  }
  const bridge = await startLiveBridge({ config: bridgeConfig });
  cleanups.push(() => bridge.close());
  Object.assign(flags, opts.agentFlags);

  let agent: TestAgent | undefined = await startAgent({ mqttUrl: bridge.mqttUrl, stateDir: agentState, flags });
  const deviceId = agent.agent.identity.deviceId;
  const authcode = await until(
    async () => (await bridge.bridge.store.devices.device(deviceId))?.authcode ?? undefined,
    'the hello',
  );
  const http = bridge.client();
  const signup = await http.post('/0/session/signup', {
    form: { login: `cmd-${randomUUID()}@example.com`, password: 'correct horse battery' },
  });
  expect(signup.status).toBe(201);
  const claim = await http.post('/0/devices/', { form: { auth: authcode } });
  expect([claim.status, claim.body]).toEqual([201, deviceId]);

  const rig: Rig = {
    bridge,
    mosquitto,
    get agent() {
      return agent;
    },
    http,
    deviceId,
    work,
    handlers,
    post: (form) => http.post(`/0/devices/${deviceId}/`, { form }),
    async send(command, extra = {}) {
      const r = await http.post(`/0/devices/${deviceId}/`, { form: { command, ...extra } });
      expect([r.status, r.body], `POST ${command}`).toEqual([200, expect.stringMatching(/^[0-9a-f-]{36}$/)]);
      return r.body;
    },
    async get(cmd) {
      const r = await http.get(`/0/devices/${deviceId}/commands/${cmd}`);
      expect(r.status, r.body).toBe(200);
      return JSON.parse(r.body) as Cmd;
    },
    finished: (cmd, ms) =>
      until(
        async () => {
          const c = await rig.get(cmd);
          return FINAL_STATES.includes(c.state) ? c : undefined;
        },
        `command ${cmd} to finish`,
        ms,
      ),
    delivered: (cmd) =>
      until(async () => {
        const c = await rig.get(cmd);
        return c.delivered !== null ? c : undefined;
      }, `command ${cmd} delivered`),
    runs: () => runsIn(work),
    release: (name) => writeFileSync(join(work, `release-${name}`), ''),
    async metaState() {
      const r = await http.get(`/0/devices/${deviceId}/meta/state`);
      return r.status === 200 ? (JSON.parse(r.body) as string) : undefined;
    },
    async stopAgent() {
      const a = agent;
      agent = undefined;
      await a?.stop();
    },
    async startAgent() {
      agent = await startAgent({ mqttUrl: bridge.mqttUrl, stateDir: agentState, flags });
      return agent;
    },
    async close() {
      // Handlers still waiting are let go, so that nothing outlives the test.
      rig.release('all');
      await rig.stopAgent();
      for (const c of cleanups.splice(0).reverse()) await c();
    },
  };
  return rig;
}
