/**
 * One process of the live benchmark's WebSocket clients (live-clients.ts). Every client connects from a loopback
 * address of its own (127.0.X.Y), so that a server's limit of connections per address does not refuse a benchmark
 * that stands for many users on many machines.
 */
import { readFileSync } from 'node:fs';
import WebSocket from 'ws';
import type {
  LiveClientSpec,
  LiveClientsInit,
  LiveClientsRequest,
  LiveConnectReport,
  LiveReport,
  LiveStats,
} from './live-clients.js';
import { replyTo } from './fleet-sim.js';
import { wsText } from './ws-text.js';

const init = JSON.parse(process.argv[2]!) as LiveClientsInit;

interface Client {
  readonly index: number;
  readonly spec: LiveClientSpec;
  ws: WebSocket | undefined;
  ready: boolean;
  openedAt: number;
  /** The newest pushed value's number seen, per simulator process (values of one process only ever grow). */
  lastSeq: Map<string, number>;
  /** The newest value seen (`m<proc>.<n>`, without its stamp). */
  lastKey: string | undefined;
}

const specs = JSON.parse(readFileSync(init.clientsFile, 'utf8')) as LiveClientSpec[];
const clients: Client[] = specs.flatMap((spec, index) =>
  index % init.of === init.index
    ? [{ index, spec, ws: undefined, ready: false, openedAt: 0, lastSeq: new Map(), lastKey: undefined }]
    : [],
);

/** 127.0.X.Y, one per client, X from 1: the whole of 127/8 is the loopback on Linux. */
function loopbackFor(i: number): string {
  return `127.0.${1 + Math.floor(i / 250)}.${1 + (i % 250)}`;
}

const now = () => performance.timeOrigin + performance.now();

// ---- what is counted between `start` and `stop` ----

let measuring = false;
let seen = new Set<string>();
let latencies: number[] = [];
let dues: number[] = [];
let keys: string[] = [];
let duplicates = 0;
let outOfOrder = 0;
let foreign = 0;
let frames = 0;
let bytes = 0;
let valueFrames = 0;
let valueFrameBytes: number[] = [];
let sampleDelta: LiveReport['sampleDelta'];
let closedByServer: Record<string, number> = {};
let sampleSnapshot: LiveConnectReport['sampleSnapshot'];

function reset(): void {
  seen = new Set();
  latencies = [];
  dues = [];
  keys = [];
  duplicates = 0;
  outOfOrder = 0;
  foreign = 0;
  frames = 0;
  bytes = 0;
  valueFrames = 0;
  valueFrameBytes = [];
  sampleDelta = undefined;
  closedByServer = {};
}

/** A stamped value: `m<proc>.<n>@<epoch ms>` (measured) or `w...` (warm-up); see fleet-sim.ts. */
function onValue(c: Client, value: string, at: number, text: string, size: number): void {
  const stampAt = value.indexOf('@');
  const dot = value.indexOf('.');
  if (stampAt < 0 || dot < 0) return;
  const proc = value.slice(1, dot);
  const seq = Number(value.slice(dot + 1, stampAt));
  const last = c.lastSeq.get(proc);
  if (last !== undefined && seq <= last) {
    if (measuring && value[0] === 'm') {
      if (seq === last) duplicates++;
      else outOfOrder++;
    }
    return;
  }
  c.lastSeq.set(proc, seq);
  c.lastKey = value.slice(0, stampAt);
  if (!measuring) return;
  valueFrames++;
  if (valueFrameBytes.length < 2000) valueFrameBytes.push(size);
  if (value[0] !== 'm') return;
  const key = value.slice(0, stampAt);
  if (seen.has(key)) {
    duplicates++;
    return;
  }
  seen.add(key);
  const due = Number(value.slice(stampAt + 1));
  latencies.push(at - due);
  dues.push(due);
  keys.push(key);
  sampleDelta ??= { text, deviceId: c.spec.deviceId, value };
}

interface Frame {
  devices?: Record<string, unknown>;
  delta?: Record<string, { d?: Record<string, { value?: unknown }> }>;
}

function onFrame(c: Client, data: WebSocket.RawData, onReady: () => void): void {
  const at = now();
  const text = wsText(data);
  const size = Buffer.isBuffer(data) ? data.length : Buffer.byteLength(text);
  if (measuring) {
    frames++;
    bytes += size;
  }
  let msg: Frame;
  try {
    msg = JSON.parse(text) as Frame;
  } catch {
    return;
  }
  if (msg.devices !== undefined && !c.ready) {
    if (!Object.hasOwn(msg.devices, c.spec.deviceId)) return;
    c.ready = true;
    sampleSnapshot ??= { text, deviceId: c.spec.deviceId };
    onReady();
    return;
  }
  if (msg.delta === undefined) return;
  for (const [id, change] of Object.entries(msg.delta)) {
    if (id !== c.spec.deviceId) {
      if (measuring) foreign++;
      continue;
    }
    const value = change?.d?.temp?.value;
    if (typeof value === 'string') onValue(c, value, at, text, size);
  }
}

// ---- connecting ----

function connectAll(req: Extract<LiveClientsRequest, { op: 'connect' }>): Promise<LiveConnectReport> {
  const todo = clients.filter((c) => c.index >= req.from && c.index < req.to && c.ws === undefined);
  const snapshotMs: number[] = [];
  let failed = 0;
  let firstError: string | undefined;
  let extensions = '';
  let protocol = '';
  return new Promise((resolve) => {
    let next = 0;
    let inFlight = 0;
    let settled = 0;
    const finish = () =>
      resolve({ connected: snapshotMs.length, failed, snapshotMs, firstError, extensions, protocol, sampleSnapshot });
    const launch = () => {
      while (inFlight < req.window && next < todo.length) {
        inFlight++;
        open(todo[next++]!);
      }
      if (settled === todo.length) finish();
    };
    const open = (c: Client) => {
      let done = false;
      const settle = (error?: string) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        inFlight--;
        settled++;
        if (error !== undefined) {
          failed++;
          firstError ??= error;
          c.ws?.terminate();
          c.ws = undefined;
        } else snapshotMs.push(performance.now() - c.openedAt);
        launch();
      };
      c.openedAt = performance.now();
      c.ready = false;
      const ws = new WebSocket(`${init.url}/0/session/`, 'thsq-user', {
        headers: { cookie: `sid=${c.spec.cookie}` },
        localAddress: loopbackFor(c.index),
        handshakeTimeout: req.timeoutMs,
      });
      c.ws = ws;
      const timer = setTimeout(() => settle(`no devices snapshot within ${req.timeoutMs} ms`), req.timeoutMs);
      ws.on('open', () => {
        extensions ||= ws.extensions;
        protocol ||= ws.protocol;
        ws.send(JSON.stringify({ delta: true, throttletime: init.throttleMs }));
      });
      ws.on('message', (data) => onFrame(c, data, () => settle()));
      ws.on('unexpected-response', (_req, res) => settle(`HTTP ${res.statusCode} instead of an upgrade`));
      ws.on('error', (err) => settle(err.message));
      ws.on('close', (code, reason) => {
        if (!done) settle(`closed ${code} ${reason.toString()}`);
        else if (c.ws === ws && c.ready) {
          const key = `${code} ${reason.toString()}`.trim();
          closedByServer[key] = (closedByServer[key] ?? 0) + 1;
          c.ws = undefined;
        }
      });
    };
    launch();
  });
}

function closeAll(): Promise<void> {
  const open = clients.filter((c) => c.ws !== undefined);
  return new Promise((resolve) => {
    let left = open.length;
    if (left === 0) resolve();
    const timer = setTimeout(resolve, 5000);
    for (const c of open) {
      const ws = c.ws!;
      c.ws = undefined;
      ws.once('close', () => {
        if (--left === 0) {
          clearTimeout(timer);
          resolve();
        }
      });
      ws.close(1000);
    }
  });
}

process.on('message', (m: LiveClientsRequest & { seq: number }) => {
  const reply = (work: Promise<unknown>) => replyTo(m.seq, work);
  switch (m.op) {
    case 'connect':
      reply(connectAll(m));
      return;
    case 'start':
      reset();
      measuring = true;
      reply(Promise.resolve(null));
      return;
    case 'stats':
      reply(Promise.resolve({ delivered: latencies.length } satisfies LiveStats));
      return;
    case 'stop': {
      measuring = false;
      const report: LiveReport = {
        delivered: latencies.length,
        latencies,
        dues,
        keys,
        lastValues: Object.fromEntries(clients.flatMap((c) => (c.lastKey ? [[c.spec.deviceId, c.lastKey]] : []))),
        duplicates,
        outOfOrder,
        foreign,
        frames,
        bytes,
        valueFrames,
        valueFrameBytes,
        sampleDelta,
        closedByServer,
      };
      reply(Promise.resolve(report));
      return;
    }
    case 'close':
      reply(closeAll());
      return;
  }
});
process.on('disconnect', () => process.exit(0));
