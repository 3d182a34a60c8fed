/**
 * The WebSocket clients of `npm run bench -- live`: child processes (`live-clients-main.ts`), each holding many
 * connections to a live channel (`GET /0/session/`, subprotocol `thsq-user`, the session cookie), driven from the
 * benchmark's process over IPC. Each client asks for deltas as the official client does
 * (`{"delta":true,"throttletime":N}`), counts as connected once its `devices` snapshot holds its device, and then
 * times every value the simulated devices push with a stamp (fleet-sim.ts, `stamp`): from when the push was due to
 * when the frame carrying it arrived.
 */
import { fork } from 'node:child_process';
import { join } from 'node:path';
import type { Cleanup } from './cleanup.js';
import { SimChild } from './fleet-sim.js';
import { ROOT, readCpuMs, stopChild } from './processes.js';

/** One client: the cookie value of its user's session and the device it watches. */
export interface LiveClientSpec {
  cookie: string;
  deviceId: string;
}

export interface LiveClientsInit {
  clientsFile: string;
  index: number;
  of: number;
  /** `ws://host:port`; the clients open `<url>/0/session/`. */
  url: string;
  throttleMs: number;
}

export type LiveClientsRequest =
  | { op: 'connect'; from: number; to: number; window: number; timeoutMs: number }
  | { op: 'start' }
  | { op: 'stats' }
  | { op: 'stop' }
  | { op: 'close' };

export interface LiveConnectReport {
  connected: number;
  failed: number;
  /** Per client connected: ms from opening the socket to its `devices` snapshot. */
  snapshotMs: number[];
  /** The first failure's reason, for the error message. */
  firstError: string | undefined;
  /** The WebSocket extensions and subprotocol the server agreed to (the first client's). */
  extensions: string;
  protocol: string;
  /** A snapshot frame as received, and the device it was for (the baseline's template). */
  sampleSnapshot: { text: string; deviceId: string } | undefined;
}

export interface LiveStats {
  /** Distinct measured values received since `start`. */
  delivered: number;
}

export interface LiveReport extends LiveStats {
  /** Due → frame latency of each measured value, ms (the first receipt of each). */
  latencies: number[];
  /** When each of those values was due (epoch ms, same order): the latency second by second. */
  dues: number[];
  /** And which value each was (`m<proc>.<n>`). */
  keys: string[];
  /** The newest value each client holds, by device. */
  lastValues: Record<string, string>;
  /** A measured value received again, or before an older one of the same device. */
  duplicates: number;
  outOfOrder: number;
  /** Deltas that named a device other than the client's own. */
  foreign: number;
  /** Frames and bytes received since `start`, and how many of the frames carried a pushed value. */
  frames: number;
  bytes: number;
  valueFrames: number;
  /** Sizes of the frames that carried a value (bytes), a sample. */
  valueFrameBytes: number[];
  /** A frame that carried a value as received, its device, and the value (the baseline's template). */
  sampleDelta: { text: string; deviceId: string; value: string } | undefined;
  /** Connections the server closed since the start, by close code and reason. */
  closedByServer: Record<string, number>;
}

/** Where the device's id and the value go in the baseline's frames (live-echo-main.ts). */
export const ID_MARK = '\u0000id\u0000';
export const VALUE_MARK = '\u0000value\u0000';

/**
 * A frame the bridge sent with its device (everywhere it occurs: the key and `meta` `unique`) and, when given, the
 * value marked where it stands as a record's `"value"`.
 */
export function markFrame(text: string, deviceId: string, value?: string): string {
  const marked = text.split(deviceId).join(ID_MARK);
  if (value === undefined) return marked;
  const member = (v: string) => `"value":"${v}"`;
  return marked.split(member(jsonInner(value))).join(member(VALUE_MARK));
}

/** A marked frame with another device and value put in: what the baseline sends. */
export function fillFrame(template: string, deviceId: string, value = ''): string {
  return template.split(VALUE_MARK).join(jsonInner(value)).split(ID_MARK).join(deviceId);
}

/** A string as it stands inside JSON quotes. */
function jsonInner(s: string): string {
  return JSON.stringify(s).slice(1, -1);
}

/** What the baseline server (live-echo-main.ts) is started with, as a JSON file. */
export interface LiveEchoConfig {
  clients: LiveClientSpec[];
  /** A `devices` frame and a `delta` frame with {@link ID_MARK} and (the delta) {@link VALUE_MARK} in them. */
  snapshot: string;
  delta: string;
  /** Offer permessage-deflate as the bridge did (when its clients negotiated it). */
  deflate: boolean;
}

/** The client processes, all driven at once; their reports are merged. */
export class LiveClients {
  private constructor(private readonly children: Array<SimChild<LiveClientsRequest>>) {}

  static start(opts: Omit<LiveClientsInit, 'index' | 'of'> & { procs: number }, cleanup: Cleanup): LiveClients {
    const children: Array<SimChild<LiveClientsRequest>> = [];
    for (let index = 0; index < opts.procs; index++) {
      const init: LiveClientsInit = {
        clientsFile: opts.clientsFile,
        index,
        of: opts.procs,
        url: opts.url,
        throttleMs: opts.throttleMs,
      };
      const proc = fork(join(ROOT, 'bench/support/live-clients-main.ts'), [JSON.stringify(init)], {
        cwd: ROOT,
        execArgv: ['--import', 'tsx'],
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      });
      cleanup.add('stop a WebSocket client process', () => stopChild(proc, 5000));
      children.push(new SimChild<LiveClientsRequest>(proc));
    }
    return new LiveClients(children);
  }

  cpuMs(): number {
    return this.children.reduce((s, c) => s + readCpuMs(c.proc.pid!), 0);
  }

  /** Opens the clients whose index is in [from, to), `window` handshakes in flight in all. */
  async connect(from: number, to: number, window: number, timeoutMs: number): Promise<LiveConnectReport> {
    const per = Math.max(1, Math.round(window / this.children.length));
    const parts = await Promise.all(
      this.children.map((c) => c.request<LiveConnectReport>({ op: 'connect', from, to, window: per, timeoutMs })),
    );
    return {
      connected: parts.reduce((s, p) => s + p.connected, 0),
      failed: parts.reduce((s, p) => s + p.failed, 0),
      snapshotMs: parts.flatMap((p) => p.snapshotMs),
      firstError: parts.find((p) => p.firstError)?.firstError,
      extensions: parts.find((p) => p.connected > 0)?.extensions ?? '',
      protocol: parts.find((p) => p.connected > 0)?.protocol ?? '',
      sampleSnapshot: parts.find((p) => p.sampleSnapshot)?.sampleSnapshot,
    };
  }

  /** Forgets what was received so far: the measured phase begins. */
  async start(): Promise<void> {
    await Promise.all(this.children.map((c) => c.request({ op: 'start' })));
  }

  async stats(): Promise<LiveStats> {
    const parts = await Promise.all(this.children.map((c) => c.request<LiveStats>({ op: 'stats' })));
    return { delivered: parts.reduce((s, p) => s + p.delivered, 0) };
  }

  async stop(): Promise<LiveReport> {
    const parts = await Promise.all(this.children.map((c) => c.request<LiveReport>({ op: 'stop' })));
    const closed: Record<string, number> = {};
    for (const p of parts) for (const [k, n] of Object.entries(p.closedByServer)) closed[k] = (closed[k] ?? 0) + n;
    const sum = (f: (p: LiveReport) => number) => parts.reduce((s, p) => s + f(p), 0);
    return {
      delivered: sum((p) => p.delivered),
      latencies: parts.flatMap((p) => p.latencies),
      dues: parts.flatMap((p) => p.dues),
      keys: parts.flatMap((p) => p.keys),
      lastValues: Object.assign({}, ...parts.map((p) => p.lastValues)) as Record<string, string>,
      duplicates: sum((p) => p.duplicates),
      outOfOrder: sum((p) => p.outOfOrder),
      foreign: sum((p) => p.foreign),
      frames: sum((p) => p.frames),
      bytes: sum((p) => p.bytes),
      valueFrames: sum((p) => p.valueFrames),
      valueFrameBytes: parts.flatMap((p) => p.valueFrameBytes),
      sampleDelta: parts.find((p) => p.sampleDelta)?.sampleDelta,
      closedByServer: closed,
    };
  }

  /** Closes every client (a normal close, 1000). */
  async close(): Promise<void> {
    await Promise.all(this.children.map((c) => c.request({ op: 'close' })));
  }

  async exit(): Promise<void> {
    await Promise.all(this.children.map((c) => stopChild(c.proc, 5000)));
  }
}
