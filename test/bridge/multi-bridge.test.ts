/**
 * Several bridges serving one fleet (docs/scaling.md): bridge processes on one PostgreSQL database and one private
 * Mosquitto, their links in one MQTT 5 share group, a real agent behind the broker. A session made on one bridge
 * works on another; a change made through one reaches the device whose messages another handles, and its
 * acknowledgement shows on all; a command posted to one runs once; and `kill -9` of a bridge in the middle of
 * traffic loses no answered write while the device keeps syncing through the others.
 */
import { randomUUID } from 'node:crypto';
import { chmodSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { HttpClient } from '../support/bridge.js';
import { type BridgeProcess, fetchSend, spawnBridge } from '../support/bridge-process.js';
import { type TestBroker, freePort, startMosquitto } from '../support/brokers.js';
import { missingPostgres, usePostgres } from '../support/postgres.js';
import { missing } from '../support/system.js';
import { until } from '../support/wait.js';

type VarJson = { value?: string; time: number; acked: number };

const noMosquitto = missing('mosquitto');

describe.skipIf(noMosquitto || (await missingPostgres()))('several bridges on PostgreSQL and Mosquitto', () => {
  const db = usePostgres();
  const cleanups: Array<() => Promise<void>> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });

  async function fleet(count: number) {
    await db.reset();
    const broker: TestBroker = await startMosquitto();
    cleanups.push(() => broker.close());
    const bridges: BridgeProcess[] = [];
    for (let i = 0; i < count; i++) {
      const dataDir = tempDir(`devcloud-multi-${i}-`);
      const b = await spawnBridge({
        dataDir,
        httpPort: await freePort(),
        config: {
          database: { url: db.url },
          // A lost bridge's share of the device messages goes to the others after 2 s, not the default minute.
          mqtt: { url: broker.url, shareGroup: 'bridges', clientId: `bridge-${i}`, sessionExpirySec: 2 },
        },
      });
      cleanups.push(async () => {
        await b.stop();
        rmSync(dataDir, { recursive: true, force: true });
      });
      bridges.push(b);
    }
    const handlers = tempDir('devcloud-multi-handlers-');
    const runs = join(handlers, 'runs');
    mkdirSync(join(handlers, 'bin'));
    writeFileSync(join(handlers, 'bin', 'count'), `#!/bin/sh\necho "$1" >> ${runs}\necho counted\n`);
    chmodSync(join(handlers, 'bin', 'count'), 0o755);
    const agent: TestAgent = await startAgent({
      mqttUrl: broker.url,
      level: 'info',
      flags: { 'commands.dir': join(handlers, 'bin') },
    });
    cleanups.push(async () => {
      await agent.stop();
      rmSync(agent.config.stateDir, { recursive: true, force: true });
      rmSync(handlers, { recursive: true, force: true });
    });
    return { broker, bridges, agent, runs };
  }

  /** One cookie jar whose requests go to whichever bridge `to` names at the time. */
  function roaming(bridges: BridgeProcess[]) {
    const state = { to: 0 };
    const sends = bridges.map((b) => fetchSend(b.url));
    const http = new HttpClient((req) => sends[state.to]!(req));
    return { http, state };
  }

  async function signupAndClaim(http: HttpClient, agent: TestAgent, bridges: BridgeProcess[]): Promise<string> {
    const signup = await http.post('/0/session/signup', {
      form: { login: `${randomUUID()}@example.com`, password: 'correct horse battery' },
    });
    expect(signup.status).toBe(201);
    const { deviceId, authcode } = agent.agent.identity;
    // The device's hello may be handled by any bridge; once it is in the database, any bridge can claim it.
    await until(
      async () => (await http.post('/0/devices/', { form: { auth: authcode } })).status === 201,
      'claim',
    ).catch((err: unknown) => {
      const said = bridges.map(
        (b, i) =>
          `bridge ${i}:\n${b
            .output()
            .split('\n')
            .filter((l) => /"level":(40|50)|hello/.test(l))
            .join('\n')}`,
      );
      throw new Error(
        `${String(err)}\nagent:\n${agent.sink.lines
          .slice(-30)
          .map((l) => JSON.stringify(l))
          .join('\n')}\n${said.join('\n')}`,
      );
    });
    return deviceId;
  }

  async function dvar(http: HttpClient, id: string, name: string): Promise<VarJson | undefined> {
    const r = await http.get(`/0/devices/${id}/d/${name}`);
    return r.status === 200 ? (JSON.parse(r.body) as VarJson) : undefined;
  }

  it('a session, a change and its acknowledgement, a command, and presence, across three bridges', async () => {
    const { bridges, agent, runs } = await fleet(3);
    const { http, state } = roaming(bridges);
    state.to = 0;
    const id = await signupAndClaim(http, agent, bridges);
    // The session made on bridge 0 is good on the others.
    for (const to of [1, 2]) {
      state.to = to;
      const me = await http.get('/0/user/');
      expect(me.status, `bridge ${to}`).toBe(200);
    }
    // A change through bridge 1 reaches the device, whose acknowledgement any bridge may handle; all show it.
    state.to = 1;
    expect((await http.post(`/0/devices/${id}/d/colour`, { form: { value: 'teal' } })).status).toBe(200);
    await until(() => agent.agent.vars.get('d', 'colour')?.value?.toString() === 'teal', 'the device took the change');
    for (const to of [0, 1, 2]) {
      state.to = to;
      const v = await until(async () => {
        const got = await dvar(http, id, 'colour');
        return got && got.value === 'teal' && got.acked >= got.time ? got : undefined;
      }, `the acknowledgement on bridge ${to}`);
      expect(v.value).toBe('teal');
    }
    // A command posted to bridge 2 runs once, and its end is seen from bridge 0.
    state.to = 2;
    const cmd = await http.post(`/0/devices/${id}/`, { form: { command: 'count once' } });
    expect(cmd.status).toBe(200);
    state.to = 0;
    const done = await until(async () => {
      const r = await http.get(`/0/devices/${id}/commands/${cmd.body}`);
      const c = JSON.parse(r.body) as { state: string; output: string | null };
      return c.state === 'done' ? c : undefined;
    }, 'the command to finish');
    expect(done.output).toBe('counted\n');
    expect(readFileSync(runs, 'utf8')).toBe('once\n');
    // Presence is right on every bridge, whichever handled the device's messages: connected, then gone.
    const presence = async (to: number) => {
      const r = await bridges[to]!.client().get(`/0/devices/${id}/meta/state`, {
        cookie: `sid=${http.jar.get('sid')}`,
      });
      return r.status === 200 ? (JSON.parse(r.body) as string) : undefined;
    };
    for (const to of [0, 1, 2]) expect(await presence(to)).toBe('connected');
    await agent.stop();
    for (const to of [0, 1, 2])
      await until(async () => (await presence(to)) === 'disconnected', `disconnected on ${to}`);
  });

  it('kill -9 of one bridge during traffic loses no answered write, and the device keeps syncing', async () => {
    const { bridges, agent } = await fleet(3);
    const { http } = roaming(bridges);
    const id = await signupAndClaim(http, agent, bridges);
    const clients = bridges.map((b) => b.client());
    // Each client needs the session: the same cookie, on each bridge.
    for (const c of clients) for (const [k, v] of http.jar) c.jar.set(k, v);

    const answered = new Map<string, string>();
    const names = ['a', 'b', 'c', 'd'];
    const victim = bridges[1]!;
    let killed = false;
    let writes = 0;
    await Promise.all(
      names.map(async (name) => {
        for (let i = 0; i < 40; i++) {
          const to = (i + names.indexOf(name)) % 3;
          if (to === 1 && killed) continue;
          const value = `${name}-${i}`;
          try {
            const r = await clients[to]!.post(`/0/devices/${id}/d/${name}`, { form: { value } });
            if (r.status === 200) answered.set(name, value);
          } catch {
            // The victim's requests fail once it is gone.
          }
          if (++writes === 60) {
            killed = true;
            await victim.kill9();
          }
        }
      }),
    );
    expect(killed).toBe(true);
    // Every variable ends with its last answered value, on the surviving bridges and on the device.
    for (const name of names) {
      const last = answered.get(name)!;
      expect(last).toBeDefined();
      for (const to of [0, 2]) {
        await until(async () => {
          const v = await dvar(clients[to]!, id, name);
          return v && v.value === last && v.acked >= v.time;
        }, `${name} = ${last}, acknowledged, on bridge ${to}`);
      }
      await until(() => agent.agent.vars.get('d', name)?.value?.toString() === last, `${name} on the device`);
    }
  });
});
