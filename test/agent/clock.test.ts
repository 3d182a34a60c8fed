/**
 * Wrong gateway clocks (decision 24, docs/sync.md#clocks), through real processes: the agent runs as its own process
 * with its wall clock shifted by libfaketime (Debian's `faketime` package), against a real bridge with its embedded
 * broker on the real clock. The shift is read from a file, so a test can step the clock while the agent runs; the
 * monotonic clock is left alone, as a real clock step leaves it.
 */
import { rmSync, writeFileSync } from 'node:fs';
import { createSocket } from 'node:dgram';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import type { LocalClient } from '../../agent/local/client.js';
import type { VarJson } from '../../agent/local/messages.js';
import { type AgentProcess, spawnAgent, tempDir, waitForSocket } from '../support/agent.js';
import { type LiveBridge, startLiveBridge } from '../support/bridge.js';
import type { HttpClient } from '../support/bridge.js';
import { freePort } from '../support/brokers.js';
import { libfaketime, missing } from '../support/system.js';
import { until } from '../support/wait.js';

const HOUR = 3_600_000;
const FAKETIME = libfaketime();

type Rec = { value?: string; time: number; acked: number };
interface ClockStatus {
  source: string;
  offsetMs: number | null;
}
interface AgentStatus {
  deviceId: string;
  authcodePrefix: string;
  clock: ClockStatus;
  nearby: { port: number | null; reported: number; repeated: number };
}

describe.skipIf(missing('libfaketime'))('an agent with a wrong clock', () => {
  const cleanups: Array<() => Promise<void> | void> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  interface Gateway {
    stateDir: string;
    /** The shift of the agent's wall clock, as libfaketime reads it: `+1h`, `+0`, ... */
    shift(offset: string): void;
    /** Starts the agent process on `mqttUrl` (the bridge, or a port where nothing listens: offline). */
    start(mqttUrl: string, extra?: string[]): Promise<LocalClient>;
    /** SIGTERM, and waits for the exit. */
    stop(): Promise<void>;
  }

  function gateway(initialShift: string): Gateway {
    if (FAKETIME === undefined) throw new Error('libfaketime is not installed (apt-get install faketime)');
    const stateDir = tempDir('devcloud-clock-');
    const clockFile = join(stateDir, 'faketime');
    writeFileSync(clockFile, `${initialShift}\n`);
    let p: AgentProcess | undefined;
    let client: LocalClient | undefined;
    const g: Gateway = {
      stateDir,
      shift: (offset) => writeFileSync(clockFile, `${offset}\n`),
      async start(mqttUrl, extra = []) {
        p = spawnAgent(
          ['--state-dir', stateDir, '--mqtt-url', mqttUrl, '--udp-port', '0', '--log-pretty', 'never', ...extra],
          {
            LD_PRELOAD: FAKETIME,
            FAKETIME_TIMESTAMP_FILE: clockFile,
            FAKETIME_NO_CACHE: '1',
            FAKETIME_DONT_FAKE_MONOTONIC: '1',
          },
        );
        client = await waitForSocket(p.socket, 30_000);
        return client;
      },
      async stop() {
        client?.close();
        client = undefined;
        if (!p) return;
        p.proc.kill('SIGTERM');
        const { code } = await p.exited;
        expect(code, p.output()).toBe(0);
        p = undefined;
      },
    };
    cleanups.push(async () => {
      client?.close();
      await p?.kill9();
      rmSync(stateDir, { recursive: true, force: true });
    });
    return g;
  }

  async function bridge(): Promise<LiveBridge> {
    const b = await startLiveBridge();
    cleanups.push(() => b.close());
    return b;
  }

  /** A user who signed up and claimed the device. */
  async function owner(b: LiveBridge, deviceId: string): Promise<HttpClient> {
    const authcode = await until(
      async () => (await b.bridge.store.devices.device(deviceId))?.authcode ?? undefined,
      'the hello',
    );
    const http = b.client();
    const signup = await http.post('/0/session/signup', {
      form: { login: `clock-${deviceId.slice(0, 8)}@example.com`, password: 'correct horse battery' },
    });
    expect(signup.status).toBe(201);
    expect((await http.post('/0/devices/', { form: { auth: authcode } })).status).toBe(201);
    return http;
  }

  const status = (c: LocalClient) => c.status<AgentStatus>();
  /** Nothing listens there: the agent is offline. */
  const offline = async () => `mqtt://127.0.0.1:${await freePort()}`;

  async function cloudVar(http: HttpClient, deviceId: string, name: string): Promise<Rec | undefined> {
    const r = await http.get(`/0/devices/${deviceId}`);
    expect(r.status).toBe(200);
    return (JSON.parse(r.body) as { d: Record<string, Rec> }).d[name];
  }

  /** Waits until the bridge and the agent hold the same acknowledged version of `name`; returns it. */
  async function settled(http: HttpClient, deviceId: string, c: LocalClient, name: string): Promise<VarJson> {
    return until(async () => {
      const [cloud, local] = [await cloudVar(http, deviceId, name), await c.get('d', name).catch(() => undefined)];
      if (!cloud || !local) return undefined;
      const same = cloud.value === local.value && cloud.time === local.time;
      return same && cloud.acked >= cloud.time && local.acked >= local.time ? local : undefined;
    }, `${name} the same and acknowledged on both sides`);
  }

  /** Simulates a reboot of a gateway without a real-time clock: what the agent learnt of the cloud's clock is lost. */
  function forgetClock(stateDir: string): void {
    const db = new Database(join(stateDir, 'agent.db'));
    try {
      db.prepare("UPDATE kv SET value = json_set(value, '$.boot', 'an earlier boot') WHERE key = 'clock'").run();
    } finally {
      db.close();
    }
  }

  it('learns the cloud clock from the bridge and runs a command with a 10 min lifetime while 1 h ahead', async () => {
    const b = await bridge();
    const g = gateway('+1h');
    const c = await g.start(b.mqttUrl);
    const { deviceId } = await status(c);
    const http = await owner(b, deviceId);

    // The offset is learnt from the bridge's answer to the hello: the agent's own clock is an hour ahead.
    const learnt = await until(async () => {
      const s = (await status(c)).clock;
      return s.offsetMs === null ? undefined : s;
    }, 'the offset learnt');
    expect(learnt.source).toBe('cloud');
    expect(Math.abs(learnt.offsetMs! + HOUR)).toBeLessThan(5_000);

    const r = await http.post(`/0/devices/${deviceId}/`, { form: { command: 'ping', lifetime: '600000' } });
    expect(r.status, r.body).toBe(200);
    const cmd = await until(async () => {
      const res = await http.get(`/0/devices/${deviceId}/commands/${r.body}`);
      const body = JSON.parse(res.body) as { state: string };
      return ['done', 'failed', 'expired'].includes(body.state) ? body : undefined;
    }, 'the command to finish');
    expect(cmd.state).toBe('done');
    await g.stop();
  });

  it('before the first contact marks versions unverified, and a user change made after an offline one wins', async () => {
    const b = await bridge();
    const g = gateway('+1h');
    let c = await g.start(b.mqttUrl);
    const { deviceId } = await status(c);
    const http = await owner(b, deviceId);
    await g.stop();
    // A reboot without a real-time clock: the agent comes back an hour ahead and knows nothing of the cloud's clock.
    forgetClock(g.stateDir);
    c = await g.start(await offline());
    expect((await status(c)).clock).toMatchObject({ source: 'own', offsetMs: null });

    // Offline, on its own clock: the gateway sets led, the user sets led and fan later, then the gateway sets fan.
    const led = await c.set('d', 'led', 'gateway');
    expect(led).toMatchObject({ unverified: true, acked: 0 });
    expect(Math.abs(led.time - Date.now() - HOUR)).toBeLessThan(5_000);
    await until(() => Date.now() > led.time - HOUR + 1_000, 'a moment after the gateway change');
    for (const name of ['led', 'fan']) {
      const r = await http.post(`/0/devices/${deviceId}/d/${name}`, { form: { value: 'user' } });
      expect(r.status, r.body).toBe(200);
    }
    const userTime = (await cloudVar(http, deviceId, 'fan'))!.time;
    await until(() => Date.now() > userTime + 1_000, 'a moment after the user change');
    const fan = await c.set('d', 'fan', 'gateway');
    expect(fan.unverified).toBe(true);
    await g.stop();

    // Back online: each side ends with the change made last in real time, with the same version.
    c = await g.start(b.mqttUrl);
    const ledNow = await settled(http, deviceId, c, 'led');
    const fanNow = await settled(http, deviceId, c, 'fan');
    expect(ledNow).toMatchObject({ value: 'user', origin: 'cloud' });
    expect(fanNow).toMatchObject({ value: 'gateway', origin: 'device' });
    // The gateway's version was re-stamped by the cloud's clock: not an hour ahead, and after the user's.
    expect(fanNow.time).toBeGreaterThan(userTime);
    expect(fanNow.time).toBeLessThan(Date.now() + 5_000);
    expect(fanNow.unverified).toBeUndefined();
    expect(b.sink.events('vars.restamped').length).toBeGreaterThan(0);

    // Once in contact, a change is stamped by the cloud's clock and goes through as it is.
    const later = await c.set('d', 'led', 'gateway again');
    expect(later.unverified).toBeUndefined();
    expect(Math.abs(later.time - Date.now())).toBeLessThan(5_000);
    expect(await settled(http, deviceId, c, 'led')).toMatchObject({ value: 'gateway again', time: later.time });
    await g.stop();
  });

  it('keeps the learnt offset across a restart, so an offline change made then loses to a later user change', async () => {
    const b = await bridge();
    const g = gateway('+1h');
    let c = await g.start(b.mqttUrl);
    const { deviceId } = await status(c);
    const http = await owner(b, deviceId);
    await until(async () => (await status(c)).clock.offsetMs !== null, 'the offset learnt');
    await g.stop();

    // Restarted offline in the same boot: the saved offset is used, so the change is stamped by the cloud's clock.
    c = await g.start(await offline());
    const s = (await status(c)).clock;
    expect(s.source).toBe('saved');
    expect(Math.abs(s.offsetMs! + HOUR)).toBeLessThan(5_000);
    const led = await c.set('d', 'led', 'gateway');
    expect(led.unverified).toBeUndefined();
    expect(Math.abs(led.time - Date.now())).toBeLessThan(5_000);
    await until(() => Date.now() > led.time + 300, 'a moment after the gateway change');
    expect((await http.post(`/0/devices/${deviceId}/d/led`, { form: { value: 'user' } })).status).toBe(200);
    await g.stop();

    c = await g.start(b.mqttUrl);
    expect(await settled(http, deviceId, c, 'led')).toMatchObject({ value: 'user', origin: 'cloud' });
    await g.stop();
  });

  it('keeps reporting nearby users after the clock steps back an hour', async () => {
    const b = await bridge();
    const g = gateway('+1h');
    // A short once-per-code window, so that the test need not wait 30 s for it to pass.
    const config = join(g.stateDir, 'agent.json');
    writeFileSync(config, JSON.stringify({ udp: { dedupeMs: 2_000 } }));
    const c = await g.start(b.mqttUrl, ['--config', config]);
    const { deviceId, nearby } = await status(c);
    const http = await owner(b, deviceId);
    const user = JSON.parse((await http.get('/0/user/')).body) as { authcode: string };
    const udp = createSocket('udp4');
    cleanups.push(() => {
      udp.close();
    });
    const hear = () =>
      new Promise<void>((resolve, reject) =>
        udp.send(user.authcode, nearby.port!, '127.0.0.1', (err) => (err ? reject(err) : resolve())),
      );
    const reports = () => b.bridge.link.received['up/heard'] ?? 0;

    await hear();
    await until(() => reports() === 1, 'the first report');
    const view = JSON.parse((await http.get('/0/network/')).body) as Record<string, unknown>;
    expect(Object.keys(view)).toHaveLength(1);

    // NTP arrives: the wall clock steps back an hour. A repeat inside the window is still held back.
    g.shift('+0');
    await until(async () => Math.abs((await status(c)).clock.offsetMs ?? HOUR) < 5_000, 'the step seen');
    await hear();
    await until(async () => (await status(c)).nearby.repeated === 1, 'the repeat held back');
    expect(reports()).toBe(1);

    // Once the window has passed, by the monotonic clock, the code is reported again.
    const heldBack = Date.now();
    await until(() => Date.now() > heldBack + 2_100, 'the window passed');
    await hear();
    await until(() => reports() === 2, 'reported again after the window');
    expect((await status(c)).nearby).toMatchObject({ reported: 2, repeated: 1 });
    await g.stop();
  });
});
