/**
 * `kill -9` of the bridge while a storm of variable writes is pushed to a real agent and its acknowledgements
 * stream back. The bridge runs as its own process on a fixed data directory; it is killed at a random point and
 * started again on the same ports, and the agent reconnects by itself. What must hold afterwards:
 *
 * - every write answered 200 `device-ok` is there: in the variable's history, and, for a variable written once,
 *   as its value; nothing that was never sent is;
 * - a variable's value is its newest history entry;
 * - every version ends acknowledged (`acked >= time`) and the same on both sides, whatever acknowledgement the
 *   kill lost (the bridge pushes again what is pending when the device says hello);
 * - every change made on the gateway meanwhile reaches the bridge and is acknowledged back.
 */
import { rmSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import type { LocalClient } from '../../agent/local/client.js';
import type { VarJson } from '../../agent/local/messages.js';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import type { HttpClient } from '../support/bridge.js';
import { type BridgeProcess, spawnBridge } from '../support/bridge-process.js';
import { freePort } from '../support/brokers.js';
import { until } from '../support/wait.js';

type VarRecord = { value?: string; time: number; acked: number };
type DeviceObject = { d: Record<string, VarRecord>; meta: Record<string, { value: string }> };
type HistoryEntry = { value?: string; by: string };

/** A GET that answers `undefined` while the bridge is away. */
async function getJson<T>(http: HttpClient, path: string): Promise<T | undefined> {
  try {
    const r = await http.get(path);
    return r.status === 200 ? (JSON.parse(r.body) as T) : undefined;
  } catch {
    return undefined;
  }
}

/** Variables written over and over, each by concurrent writers: their history is checked. */
const HOT = ['h0', 'h1', 'h2', 'h3', 'h4', 'h5'];
const HOT_WRITERS = 2;
const HOT_WRITES = 15;
/** Writers that each write a row of fresh variables once: their acknowledgements land all through the storm. */
const COLD_WRITERS = 6;
const COLD_WRITES = 25;
const ROUNDS = 3;

/** What differs between the bridge and the agent, or is not acknowledged on either side; empty when settled. */
function unsettled(bridge: DeviceObject, agent: readonly VarJson[]): string[] {
  const problems: string[] = [];
  const held = new Map(agent.map((v) => [v.name, v]));
  for (const [name, rec] of Object.entries(bridge.d)) {
    const a = held.get(name);
    if (!a || a.value !== rec.value || a.time !== rec.time) problems.push(`${name}: bridge and agent differ`);
    else if (rec.acked < rec.time || a.acked < a.time) problems.push(`${name}: not acknowledged`);
  }
  for (const name of held.keys()) if (!(name in bridge.d)) problems.push(`${name}: not on the bridge`);
  return problems;
}

describe('kill -9 of the bridge during a storm of acknowledgements', () => {
  const cleanups: Array<() => Promise<void>> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  it('keeps every answered write and ends with every version acknowledged', async () => {
    const dataDir = tempDir('devcloud-crash-');
    const ports = { dataDir, httpPort: await freePort(), mqttPort: await freePort() };
    let bridge: BridgeProcess = await spawnBridge(ports);
    cleanups.push(async () => {
      await bridge.stop();
      rmSync(dataDir, { recursive: true, force: true });
    });
    const agent: TestAgent = await startAgent({ mqttUrl: bridge.mqttUrl, level: 'info' });
    cleanups.push(async () => {
      await agent.stop();
      rmSync(agent.config.stateDir, { recursive: true, force: true });
    });
    const local: LocalClient = await agent.client();
    cleanups.push(() => {
      local.close();
      return Promise.resolve();
    });
    const { deviceId, authcode } = agent.agent.identity;

    // The ports stay the same across restarts, so one client (and its session cookie) serves every bridge.
    const http = bridge.client();
    const signup = await http.post('/0/session/signup', {
      form: { login: 'crash@example.com', password: 'pw-crash-1234' },
    });
    expect(signup.status).toBe(201);
    await until(async () => (await http.post('/0/devices/', { form: { auth: authcode } })).status === 201, 'claim');

    /** Values answered 200, and values whose request the kill cut off, by variable. */
    const answered = new Map<string, Set<string>>();
    const unanswered = new Map<string, Set<string>>();
    const add = (m: Map<string, Set<string>>, name: string, value: string) =>
      (m.get(name) ?? m.set(name, new Set()).get(name)!).add(value);

    for (let round = 0; round < ROUNDS; round++) {
      await until(
        async () => (await getJson<string>(http, `/0/devices/${deviceId}/meta/state`)) === 'connected',
        'the agent connected to the bridge',
      );
      const total = HOT.length * HOT_WRITERS * HOT_WRITES + COLD_WRITERS * COLD_WRITES;
      const killAfter = 30 + Math.floor(Math.random() * (total - 90));
      const context = `round ${round}, killed after ${killAfter} answers`;
      let ok = 0;
      let killed: Promise<void> | undefined;
      const victim = bridge;

      /** Writes `[name, value]` pairs in order; stops at the first one without an answer. */
      const writer = async (writes: Array<[string, string]>) => {
        for (const [name, value] of writes) {
          let status = 0;
          let body = '';
          try {
            const r = await http.post(`/0/devices/${deviceId}/d/${name}`, { form: { value } });
            status = r.status;
            body = r.body;
          } catch {
            // The bridge went away with the request: it may or may not have been committed.
          }
          if (status !== 200) {
            add(unanswered, name, value);
            return;
          }
          expect(body).toBe('device-ok');
          add(answered, name, value);
          if (++ok === killAfter) killed = victim.kill9();
        }
      };
      const writers: Array<Array<[string, string]>> = [];
      for (const name of HOT) {
        for (let w = 0; w < HOT_WRITERS; w++) {
          writers.push(Array.from({ length: HOT_WRITES }, (_, i) => [name, `r${round}-${name}-${w}-${i}`]));
        }
      }
      for (let w = 0; w < COLD_WRITERS; w++) {
        writers.push(Array.from({ length: COLD_WRITES }, (_, i) => [`c${round}-${w}-${i}`, `cold-${round}-${w}-${i}`]));
      }
      // Changes on the gateway go on through the storm and the outage.
      let storming = true;
      const gateway = (async () => {
        for (let i = 0; storming; i++) {
          await local.set('d', 'gw', `r${round}-gw-${i}`);
          await new Promise((r) => setTimeout(r, 2));
        }
      })();
      await Promise.all(writers.map(writer));
      expect(killed, context).toBeDefined();
      await killed;
      storming = false;
      await gateway;

      bridge = await spawnBridge(ports);

      let last: string[] = [];
      await until(async () => {
        const device = await getJson<DeviceObject>(http, `/0/devices/${deviceId}`);
        if (!device) return undefined;
        last = unsettled(device, await local.list('d'));
        return last.length === 0;
      }, `every version acknowledged (${context})`).catch((err: Error) => {
        throw new Error(`${err.message}; still unsettled: ${last.slice(0, 5).join('; ')}`);
      });

      const device = (await getJson<DeviceObject>(http, `/0/devices/${deviceId}`))!;
      for (const [name, values] of answered) {
        if (HOT.includes(name)) continue;
        // A variable written once holds the value answered 200.
        expect(device.d[name]?.value, `${name} (${context})`).toBe([...values][0]);
      }
      for (const [name, rec] of Object.entries(device.d)) {
        if (name === 'gw') continue;
        const sent = answered.get(name)?.has(rec.value!) || unanswered.get(name)?.has(rec.value!);
        expect(sent, `${name}=${rec.value} was never sent (${context})`).toBe(true);
      }
      for (const name of HOT) {
        const history = (await getJson<HistoryEntry[]>(http, `/0/devices/${deviceId}/d/${name}?latest=1000`))!;
        const values = new Set(history.map((h) => h.value!));
        const missing = [...(answered.get(name) ?? [])].filter((v) => !values.has(v));
        expect(missing, `${name}: answered 200 but not in history (${context})`).toEqual([]);
        const phantom = [...values].filter((v) => !answered.get(name)?.has(v) && !unanswered.get(name)?.has(v));
        expect(phantom, `${name}: in history but never sent (${context})`).toEqual([]);
        expect(history.every((h) => h.by === 'user')).toBe(true);
        expect(device.d[name]?.value, `${name}: the value is the newest history entry (${context})`).toBe(
          history[0]!.value,
        );
      }
    }
  });
});
