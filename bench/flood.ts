/**
 * `npm run bench -- flood`: what a hello flood from one device does to another user's REST latency. The bridge
 * runs as the service does (a child process from `dist/`, production settings but open enrolment), with its
 * embedded broker or, with `--broker mosquitto`, a private Mosquitto it is a client of. A probe sends
 * `GET /0/user/` at a fixed rate as one logged-in user and times each request from when it was due; first with
 * no flood (the baseline), then while one device publishes `--hellos` hellos in one burst, as fast as TCP takes
 * them, and reconnects to do it again whenever it is cut off. See bench/README.md.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { encode, topicFor } from '../protocol/index.js';
import { startMosquitto } from '../test/support/brokers.js';
import { helloMessage } from '../test/support/mqtt-device.js';
import { type RawClient, publishPacket, rawConnect } from '../test/support/raw-mqtt.js';
import { prepareBridge, spawnBridgeProcess } from './support/bridge-process.js';
import { type Cleanup, UsageError } from './support/cleanup.js';
import { ROOT } from './support/processes.js';
import { type ProbeRun, cookieOf, probe, send } from './support/http-load.js';
import { type Row, formatTable, percentile, round } from './support/report.js';
import { seedUser } from './support/seed.js';

const TARGET = {
  /** How much another user's p99 may move during the flood, ms. */
  p99DeltaMs: 5,
};
const LOGIN = 'bystander@example.com';
const PASSWORD = 'bench-password-1';
const SETUP_TIMEOUT_MS = 30_000;

interface Options {
  broker: 'aedes' | 'mosquitto';
  hellos: number;
  rate: number;
  durationS: number;
  source: boolean;
  cpuProf: boolean;
}

const USAGE = `options:
  --broker aedes|mosquitto  the embedded broker (default) or a private Mosquitto
  --hellos N                hellos per burst (default 3000)
  --rate N                  probe requests per second (default 100)
  --duration S              seconds of each probe window (default 5)
  --source                  run the bridge from the TypeScript source through tsx
  --cpu-prof                write a V8 CPU profile of the bridge to .bench/profiles/`;

function options(args: string[]): Options {
  let v;
  try {
    v = parseArgs({
      args,
      options: {
        broker: { type: 'string', default: 'aedes' },
        hellos: { type: 'string', default: '3000' },
        rate: { type: 'string', default: '100' },
        duration: { type: 'string', default: '5' },
        source: { type: 'boolean', default: false },
        'cpu-prof': { type: 'boolean', default: false },
      },
      strict: true,
    }).values;
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n${USAGE}`);
  }
  const int = (name: string, raw: string, min: number) => {
    const n = Number(raw);
    if (!Number.isInteger(n) || n < min) throw new UsageError(`--${name} must be an integer >= ${min}\n${USAGE}`);
    return n;
  };
  if (v.broker !== 'aedes' && v.broker !== 'mosquitto') throw new UsageError(`--broker aedes|mosquitto\n${USAGE}`);
  return {
    broker: v.broker,
    hellos: int('hellos', v.hellos, 1),
    rate: int('rate', v.rate, 1),
    durationS: int('duration', v.duration, 1),
    source: v.source,
    cpuProf: v['cpu-prof'],
  };
}

function hello(deviceId: string): Buffer {
  return encode('up/hello', helloMessage(deviceId));
}

/**
 * One device that floods: a burst of hellos, and again after every reconnect, until stopped. Counts the bursts
 * and the logins the broker refused.
 */
function flooder(port: number, hellos: number): { stop(): void; bursts(): number; refused(): number } {
  const deviceId = randomUUID();
  const login = { clientId: deviceId, username: deviceId, password: randomBytes(32).toString('hex') };
  const burst = Buffer.concat(
    Array.from({ length: hellos }, () => publishPacket(topicFor(deviceId, 'up/hello'), hello(deviceId))),
  );
  let stopped = false;
  let bursts = 0;
  let refused = 0;
  let client: RawClient | undefined;
  void (async () => {
    while (!stopped) {
      try {
        client = await rawConnect(port, login);
        bursts++;
        await client.write(burst);
        while (!stopped && !client.closed()) await new Promise((r) => setTimeout(r, 50));
      } catch {
        refused++;
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  })();
  return {
    stop: () => {
      stopped = true;
      client?.close();
    },
    bursts: () => bursts,
    refused: () => refused,
  };
}

/**
 * CPU time a process has used so far, ms (Linux: user and system time from /proc, in clock ticks of 10 ms);
 * `undefined` where /proc cannot be read. On a shared machine this says what the flood costs the bridge better
 * than latency does, which other processes' load moves too.
 */
function cpuMs(pid: number): number | undefined {
  try {
    // The fields after the command name, which is in parentheses and may hold spaces.
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return (Number(fields[11]) + Number(fields[12])) * 10;
  } catch {
    return undefined;
  }
}

function summary(run: ProbeRun): { p50: number; p99: number; max: number; ok: number } {
  return {
    p50: round(percentile(run.latencies, 50)),
    p99: round(percentile(run.latencies, 99)),
    max: round(Math.max(...run.latencies)),
    ok: run.statuses['200'] ?? 0,
  };
}

export async function run(args: string[], cleanup: Cleanup): Promise<number> {
  const opts = options(args);
  const prepared = prepareBridge(opts.source);
  console.log(`flood: bridge from ${prepared.runtime} (${prepared.note}), broker ${opts.broker}`);
  const dataDir = mkdtempSync(join(tmpdir(), 'devcloud-bench-flood-'));
  cleanup.add('remove the data folder', () => rmSync(dataDir, { recursive: true, force: true }));
  await seedUser(dataDir, LOGIN, PASSWORD);

  let mqttArgs: string[] = [];
  let brokerPort = 0;
  if (opts.broker === 'mosquitto') {
    const mosquitto = await startMosquitto();
    cleanup.add('stop Mosquitto', () => mosquitto.close());
    mqttArgs = ['--mqtt-url', mosquitto.url];
    brokerPort = mosquitto.port;
  }
  let cpuProfDir: string | undefined;
  if (opts.cpuProf) {
    cpuProfDir = join(ROOT, '.bench/profiles');
    mkdirSync(cpuProfDir, { recursive: true });
  }
  const bridge = await spawnBridgeProcess(
    // A sample every 0.2 ms: the stalls that matter here are a few ms long.
    {
      runtime: prepared.runtime,
      dataDir,
      cpuProfDir,
      nodeArgs: cpuProfDir ? ['--cpu-prof-interval', '200'] : [],
      args: mqttArgs,
    },
    cleanup,
  );
  if (opts.broker === 'aedes') brokerPort = Number(new URL(bridge.mqttUrl).port);

  const login = await send(`${bridge.url}/0/session/login`, {
    method: 'POST',
    body: new URLSearchParams({ login: LOGIN, password: PASSWORD }).toString(),
    timeoutMs: SETUP_TIMEOUT_MS,
  }).done;
  const cookie = cookieOf(login);
  if (login.status !== 201 || !cookie) throw new Error(`login failed: ${login.status} ${login.body}`);
  const probeOnce = () =>
    probe({ url: `${bridge.url}/0/user/`, headers: { cookie }, rate: opts.rate, durationMs: opts.durationS * 1000 });
  // Warm up the route and the JIT before the baseline.
  await probe({ url: `${bridge.url}/0/user/`, headers: { cookie }, rate: opts.rate, durationMs: 1000 });

  const cpu0 = cpuMs(bridge.pid);
  const baseline = summary(await probeOnce());
  const cpu1 = cpuMs(bridge.pid);
  const flood = flooder(brokerPort, opts.hellos);
  cleanup.add('stop the flooder', () => flood.stop());
  const during = summary(await probeOnce());
  const cpu2 = cpuMs(bridge.pid);
  const cpu =
    cpu0 === undefined || cpu1 === undefined || cpu2 === undefined
      ? undefined
      : { baselineMs: cpu1 - cpu0, duringMs: cpu2 - cpu1 };
  flood.stop();

  const delta = round(during.p99 - baseline.p99);
  const met = delta <= TARGET.p99DeltaMs && during.ok === opts.rate * opts.durationS;
  const rows: Row[] = [
    {
      figure: `GET /0/user/ p50 (${opts.rate}/s)`,
      measured: `${during.p50} ms`,
      baseline: `${baseline.p50} ms`,
      ratio: '',
      target: '',
      met: undefined,
    },
    {
      figure: `GET /0/user/ p99 during the flood`,
      measured: `${during.p99} ms`,
      baseline: `${baseline.p99} ms`,
      ratio: `+${delta} ms`,
      target: `≤ +${TARGET.p99DeltaMs} ms`,
      met,
    },
    {
      figure: 'GET /0/user/ max',
      measured: `${during.max} ms`,
      baseline: `${baseline.max} ms`,
      ratio: '',
      target: '',
      met: undefined,
    },
    {
      figure: 'bridge CPU time in the window',
      measured: cpu ? `${cpu.duringMs} ms` : 'n/a',
      baseline: cpu ? `${cpu.baselineMs} ms` : '',
      ratio: cpu ? `+${cpu.duringMs - cpu.baselineMs} ms` : '',
      target: '',
      met: undefined,
    },
    {
      figure: 'flood bursts sent / logins refused',
      measured: `${flood.bursts()} / ${flood.refused()}`,
      baseline: '',
      ratio: '',
      target: '',
      met: undefined,
    },
  ];
  console.log(formatTable(rows));
  console.log(
    JSON.stringify({
      bench: 'flood',
      broker: opts.broker,
      hellos: opts.hellos,
      rate: opts.rate,
      durationS: opts.durationS,
      baseline,
      during,
      p99DeltaMs: delta,
      bursts: flood.bursts(),
      refusedLogins: flood.refused(),
      bridgeCpuMs: cpu ?? null,
      met,
    }),
  );
  if (cpuProfDir) {
    // The profile is written when the bridge exits.
    await bridge.stop();
    console.log(`bridge CPU profile written to ${cpuProfDir}`);
  }
  return met ? 0 : 1;
}
