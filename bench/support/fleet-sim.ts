/**
 * The simulated fleet of `npm run bench -- fleet`: child processes (`fleet-sim-main.ts`), each holding many
 * device connections on a hand-written MQTT client (`fleet-mqtt.ts`), driven from the benchmark's process over
 * IPC. A device does what an agent does on the wire (docs/protocol.md): it connects with its id, secret and last
 * will, subscribes to its `down/#`, publishes `state` `online` and a hello that asks for the cloud's clock, and
 * counts as connected once the cloud's answer to that hello (a `down/vars` with `now`) arrives. Then it pushes
 * one `d` variable at a time on `up/vars` and waits for `down/acks`, acknowledges whatever comes on `down/vars`,
 * and pings when idle.
 */
import { type ChildProcess, fork } from 'node:child_process';
import { join } from 'node:path';
import type { Cleanup } from './cleanup.js';
import { ROOT, readCpuMs, stopChild } from './processes.js';

/** One device as the simulator knows it: what it logs in with and the auth code its hello reports. */
export interface SimDevice {
  id: string;
  secret: string;
  authcode: string;
}

/** What a child is started with (its only argument, as JSON). */
export interface SimInit {
  devicesFile: string;
  /** This child takes the devices whose index modulo `of` is `index`. */
  index: number;
  of: number;
  /** Where device `i` connects: `endpoints[i % endpoints.length]`. */
  endpoints: Array<{ host: string; port: number }>;
  keepaliveSec: number;
}

export type SimRequest =
  | { op: 'connect'; window: number; timeoutMs: number; attempts: number }
  | {
      op: 'push';
      rate: number;
      warmupMs: number;
      durationMs: number;
      drainMs: number;
      /**
       * Each pushed value names itself and when it was due (`m<proc>.<n>@<epoch ms>`, `w` instead of `m` in the
       * warm-up), so that whoever sees it later can time it: the live benchmark's WebSocket clients.
       */
      stamp?: boolean;
      /** Numeric values, a share of them spikes that cross a rule's threshold (the rules benchmark). */
      spikes?: SpikeSpec;
    }
  | { op: 'disconnect' };

export interface ConnectReport {
  devices: number;
  connected: number;
  failed: number;
  retries: number;
  /** Epoch ms (sub-ms) of the first connection attempt and of the last hello answered. */
  firstStart: number;
  lastReady: number;
  /** Per device connected: ms from its first attempt to its CONNACK, and to the answer to its hello. */
  connackMs: number[];
  readyMs: number[];
  /** Connections that were up and then closed by the other side, since the start. */
  lost: number;
}

export interface PushReport {
  /** Pushes due in the measured window, and how many of them were acknowledged before the drain ended. */
  sent: number;
  acked: number;
  /** Push → ack latency of each acknowledged push of the window, from when it was due, ms. */
  latencies: number[];
  /** Every push of the phase (warm-up included), and their acknowledgements. */
  sentTotal: number;
  ackedTotal: number;
  /** How late the simulator's sending timer ran behind the pushes' due times: p99 and max, ms. */
  lagP99Ms: number;
  lagMaxMs: number;
  /** Devices ready at the start of the phase, and connections lost since the start. */
  ready: number;
  lost: number;
  /** `down/vars` items received and acknowledged (pushes from the cloud: a re-stamp or a catch-up). */
  downItems: number;
  /** With `stamp`: when each measured value (`m<proc>.<n>`) was acknowledged (epoch ms), and each device's last value. */
  ackedAt?: Record<string, number>;
  lastValues?: Record<string, string>;
  /** With `spikes`: every spike of the phase, warm-up included. */
  spikes?: SpikeMark[];
}

/**
 * Numeric values for the rules benchmark: each push's value is `<part>.<n>`, `n` unique within the simulator
 * process for its whole life (so that a device and a value name one push), `part` `normal` for most pushes and, for
 * a share `fraction` of them drawn at random (seeded), a spike: `high` and `low` in turn for each device, so that
 * of two spikes of one device in a row the second crosses another threshold than the first.
 */
export interface SpikeSpec {
  fraction: number;
  normal: number;
  high: number;
  low: number;
  seed: number;
}

/** A spike pushed: its device and value, when it was due, and when its acknowledgement came (epoch ms). */
export interface SpikeMark {
  deviceId: string;
  value: string;
  due: number;
  acked: number | undefined;
  /** Due in the measured window (after the warm-up). */
  measured: boolean;
}

type Reply = { seq: number; ok: true; result: unknown } | { seq: number; ok: false; error: string };

/** In a child process: answers request `seq` with what `work` resolves to, or its error (the other side of {@link SimChild}). */
export function replyTo(seq: number, work: Promise<unknown>): void {
  void work.then(
    (result) => process.send?.({ seq, ok: true, result } satisfies Reply),
    (err: unknown) => process.send?.({ seq, ok: false, error: String(err) } satisfies Reply),
  );
}

/** A child process driven over IPC: each request gets the reply with its sequence number. */
export class SimChild<R extends object = SimRequest> {
  private seq = 0;
  private readonly waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  private exited: Error | undefined;

  constructor(readonly proc: ChildProcess) {
    proc.on('message', (m: Reply) => {
      const w = this.waiting.get(m.seq);
      if (!w) return;
      this.waiting.delete(m.seq);
      if (m.ok) w.resolve(m.result);
      else w.reject(new Error(m.error));
    });
    proc.once('exit', (code, signal) => {
      this.exited = new Error(`a simulator process exited (${signal ?? code})`);
      for (const w of this.waiting.values()) w.reject(this.exited);
      this.waiting.clear();
    });
  }

  request<T>(req: R): Promise<T> {
    if (this.exited) return Promise.reject(this.exited);
    const seq = ++this.seq;
    return new Promise<T>((resolve, reject) => {
      this.waiting.set(seq, { resolve: resolve as (v: unknown) => void, reject });
      this.proc.send({ seq, ...req });
    });
  }
}

export interface SimFleetOptions {
  procs: number;
  devicesFile: string;
  endpoints: Array<{ host: string; port: number }>;
  keepaliveSec: number;
}

/** The simulator's processes, all of them driven at once; their reports are merged. */
export class SimFleet {
  private constructor(private readonly children: SimChild[]) {}

  static start(opts: SimFleetOptions, cleanup: Cleanup): SimFleet {
    const children: SimChild[] = [];
    for (let index = 0; index < opts.procs; index++) {
      const init: SimInit = {
        devicesFile: opts.devicesFile,
        index,
        of: opts.procs,
        endpoints: opts.endpoints,
        keepaliveSec: opts.keepaliveSec,
      };
      const proc = fork(join(ROOT, 'bench/support/fleet-sim-main.ts'), [JSON.stringify(init)], {
        cwd: ROOT,
        execArgv: ['--import', 'tsx'],
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      });
      cleanup.add('stop a simulator process', () => stopChild(proc, 5000));
      children.push(new SimChild(proc));
    }
    return new SimFleet(children);
  }

  get pids(): number[] {
    return this.children.map((c) => c.proc.pid!);
  }

  /** CPU time of all the simulator's processes so far, ms. */
  cpuMs(): number {
    return this.pids.reduce((s, pid) => s + readCpuMs(pid), 0);
  }

  /** Connects every device, `window` at a time in all (split between the processes). */
  async connect(window: number, timeoutMs: number, attempts: number): Promise<ConnectReport> {
    const per = Math.max(1, Math.round(window / this.children.length));
    const parts = await Promise.all(
      this.children.map((c) => c.request<ConnectReport>({ op: 'connect', window: per, timeoutMs, attempts })),
    );
    return {
      devices: sum(parts, (p) => p.devices),
      connected: sum(parts, (p) => p.connected),
      failed: sum(parts, (p) => p.failed),
      retries: sum(parts, (p) => p.retries),
      firstStart: Math.min(...parts.map((p) => p.firstStart)),
      lastReady: Math.max(...parts.map((p) => p.lastReady)),
      connackMs: parts.flatMap((p) => p.connackMs),
      readyMs: parts.flatMap((p) => p.readyMs),
      lost: sum(parts, (p) => p.lost),
    };
  }

  /** Pushes at `rate` a second in all, spread evenly over the processes and their devices. */
  async push(
    rate: number,
    warmupMs: number,
    durationMs: number,
    drainMs: number,
    stamp = false,
    spikes?: SpikeSpec,
  ): Promise<PushReport> {
    const per = rate / this.children.length;
    const parts = await Promise.all(
      this.children.map((c, i) =>
        c.request<PushReport>({
          op: 'push',
          rate: per,
          warmupMs,
          durationMs,
          drainMs,
          stamp,
          // Each process draws its own spikes.
          ...(spikes && { spikes: { ...spikes, seed: spikes.seed + i } }),
        }),
      ),
    );
    return {
      sent: sum(parts, (p) => p.sent),
      acked: sum(parts, (p) => p.acked),
      latencies: parts.flatMap((p) => p.latencies),
      sentTotal: sum(parts, (p) => p.sentTotal),
      ackedTotal: sum(parts, (p) => p.ackedTotal),
      lagP99Ms: Math.max(...parts.map((p) => p.lagP99Ms)),
      lagMaxMs: Math.max(...parts.map((p) => p.lagMaxMs)),
      ready: sum(parts, (p) => p.ready),
      lost: sum(parts, (p) => p.lost),
      downItems: sum(parts, (p) => p.downItems),
      ...(stamp && {
        ackedAt: Object.assign({}, ...parts.map((p) => p.ackedAt)) as Record<string, number>,
        lastValues: Object.assign({}, ...parts.map((p) => p.lastValues)) as Record<string, string>,
      }),
      ...(spikes && { spikes: parts.flatMap((p) => p.spikes ?? []) }),
    };
  }

  /** Every device sends DISCONNECT (so no last will) and closes. */
  async disconnect(): Promise<void> {
    await Promise.all(this.children.map((c) => c.request({ op: 'disconnect' })));
  }

  async stop(): Promise<void> {
    await Promise.all(this.children.map((c) => stopChild(c.proc, 5000)));
  }
}

function sum<T>(xs: readonly T[], f: (x: T) => number): number {
  return xs.reduce((s, x) => s + f(x), 0);
}
