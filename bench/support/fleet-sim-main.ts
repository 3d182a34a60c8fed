/**
 * One process of the simulated fleet (fleet-sim.ts): many devices, each on its own TCP connection, driven by the
 * benchmark's process over IPC. Timers are per process, never per device: one sweep a second sends the pings of
 * idle devices and gives up on connections that take too long.
 */
import { readFileSync } from 'node:fs';
import { type Socket, connect } from 'node:net';
import { ackFor, decode, downFilter, encode, topicFor } from '../../protocol/index.js';
import type { VarItem } from '../../protocol/index.js';
import {
  CONNACK,
  DISCONNECT_PACKET,
  PINGREQ_PACKET,
  PUBLISH,
  PacketReader,
  SUBACK,
  connectPacket,
  publishPacket,
  pubackPacket,
  subscribePacket,
} from './fleet-mqtt.js';
import {
  type ConnectReport,
  type PushReport,
  type SimDevice,
  type SimInit,
  type SimRequest,
  type SpikeMark,
  replyTo,
} from './fleet-sim.js';

const init = JSON.parse(process.argv[2]!) as SimInit;

const enum Phase {
  Idle,
  Connecting,
  Subscribing,
  Hello,
  Ready,
  Closing,
  Lost,
  Failed,
}

interface Device {
  readonly spec: SimDevice;
  readonly endpoint: { host: string; port: number };
  sock: Socket | undefined;
  phase: Phase;
  packetId: number;
  /** performance.now() of the last packet written: an idle device pings. */
  lastWrite: number;
  /** The `time` of its latest push: each push's is later, so that it names its acknowledgement. */
  lastTime: number;
  /** Pushes waiting for their acknowledgement: version time → when the push was due. */
  pending: Map<number, number> | undefined;
  attempts: number;
  /** performance.now() of the first attempt, of the current attempt, of the CONNACK and of the hello's answer. */
  firstStart: number;
  attemptStart: number;
  connackAt: number;
  readyAt: number;
  varsTopic: Buffer | undefined;
  /** Spikes pushed so far (the rules benchmark): even ones go high, odd ones low. */
  spikes: number;
}

const all = (JSON.parse(readFileSync(init.devicesFile, 'utf8')) as SimDevice[]).flatMap((spec, i) =>
  i % init.of === init.index ? [{ spec, endpoint: init.endpoints[i % init.endpoints.length]! }] : [],
);
const devices: Device[] = all.map(({ spec, endpoint }) => ({
  spec,
  endpoint,
  sock: undefined,
  phase: Phase.Idle,
  packetId: 0,
  lastWrite: 0,
  lastTime: 0,
  pending: undefined,
  attempts: 0,
  firstStart: 0,
  attemptStart: 0,
  connackAt: 0,
  readyAt: 0,
  varsTopic: undefined,
  spikes: 0,
}));

const keepaliveMs = init.keepaliveSec * 1000;
let lost = 0;
let seq = 0;
/** The `n` of a numeric value (`spikes`): never reused while the process lives, across phases too. */
let valueSeq = 0;

/** A small seeded generator (mulberry32): the same spikes for the same seed. */
function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
/** Unique within the run: the process's index and a counter (docs/protocol.md: 1 to 64 characters). */
const nextId = () => `s${init.index}-${(++seq).toString(36)}`;

// The payloads sent are checked against the contract once, so that the figures measure the real path.
function checkPayloads(): void {
  const d = devices[0];
  if (!d) return;
  const samples = [
    decode('up/hello', helloPayload(d)),
    decode('up/vars', pushPayload(Date.now(), 'x')),
    decode('up/acks', acksPayload([pushItem(Date.now(), 'x')])),
  ];
  for (const s of samples) if (!s.ok) throw new Error(`the simulator's payload is invalid: ${s.reason}`);
}

function helloPayload(d: Device): Buffer {
  const now = Date.now();
  return encode('up/hello', {
    id: nextId(),
    protocol: 1,
    deviceId: d.spec.id,
    authcode: d.spec.authcode,
    platform: 'linux-arm64',
    agentVersion: '0.1.0',
    fwVersion: '2.4.1',
    mode: 'master',
    bootTime: now,
    ts: now,
    clock: true,
  });
}

function pushItem(time: number, value: string): VarItem {
  return { kind: 'push', type: 'd', name: 'temp', value, time, origin: 'device' };
}

function pushPayload(time: number, value: string): Buffer {
  return encode('up/vars', { id: nextId(), items: [pushItem(time, value)] });
}

function acksPayload(items: readonly VarItem[]): Buffer {
  return encode('up/acks', { id: nextId(), acks: items.map(ackFor) });
}

function nextPacketId(d: Device): number {
  d.packetId = (d.packetId % 65535) + 1;
  return d.packetId;
}

function write(d: Device, buf: Buffer): void {
  d.lastWrite = performance.now();
  d.sock?.write(buf);
}

// ---- connecting ----

let connectRun:
  | {
      window: number;
      timeoutMs: number;
      attempts: number;
      next: number;
      inFlight: number;
      settled: number;
      retries: number;
      done: () => void;
    }
  | undefined;

function startAttempt(d: Device): void {
  d.attempts++;
  const now = performance.now();
  if (d.attempts === 1) d.firstStart = now;
  d.attemptStart = now;
  d.phase = Phase.Connecting;
  const sock = connect({ host: d.endpoint.host, port: d.endpoint.port, noDelay: true });
  d.sock = sock;
  const reader = new PacketReader((type, flags, buf, start, len) => onPacket(d, type, flags, buf, start, len));
  sock.on('connect', () =>
    write(
      d,
      connectPacket({
        clientId: d.spec.id,
        username: d.spec.id,
        password: d.spec.secret,
        keepaliveSec: init.keepaliveSec,
        will: { topic: topicFor(d.spec.id, 'state'), payload: encode('state', 'offline') },
      }),
    ),
  );
  sock.on('data', (chunk: Buffer) => reader.feed(chunk));
  sock.on('error', () => undefined);
  sock.on('close', () => onClose(d, sock));
}

function settle(d: Device, phase: Phase.Ready | Phase.Failed): void {
  d.phase = phase;
  const run = connectRun;
  if (!run) return;
  run.inFlight--;
  run.settled++;
  launch();
}

function retryOrFail(d: Device): void {
  const run = connectRun;
  if (run && d.attempts < run.attempts) {
    run.retries++;
    d.phase = Phase.Idle;
    setTimeout(() => startAttempt(d), 1000);
  } else settle(d, Phase.Failed);
}

function onClose(d: Device, sock: Socket): void {
  if (d.sock !== sock) return;
  d.sock = undefined;
  switch (d.phase) {
    case Phase.Connecting:
    case Phase.Subscribing:
    case Phase.Hello:
      retryOrFail(d);
      return;
    case Phase.Ready:
      lost++;
      d.phase = Phase.Lost;
      return;
    default:
      return;
  }
}

function launch(): void {
  const run = connectRun;
  if (!run) return;
  while (run.inFlight < run.window && run.next < devices.length) {
    run.inFlight++;
    startAttempt(devices[run.next++]!);
  }
  if (run.settled === devices.length) run.done();
}

function connectAll(req: Extract<SimRequest, { op: 'connect' }>): Promise<ConnectReport> {
  return new Promise((resolve) => {
    const finish = () => {
      connectRun = undefined;
      const ready = devices.filter((d) => d.phase === Phase.Ready);
      const origin = performance.timeOrigin;
      resolve({
        devices: devices.length,
        connected: ready.length,
        failed: devices.length - ready.length,
        retries: run.retries,
        firstStart: origin + Math.min(...devices.map((d) => d.firstStart)),
        lastReady: origin + Math.max(...ready.map((d) => d.readyAt)),
        connackMs: ready.map((d) => d.connackAt - d.firstStart),
        readyMs: ready.map((d) => d.readyAt - d.firstStart),
        lost,
      });
    };
    const run = { ...req, next: 0, inFlight: 0, settled: 0, retries: 0, done: finish };
    connectRun = run;
    if (devices.length === 0) finish();
    else launch();
  });
}

// ---- what the broker sends ----

let pushRun: PushRun | undefined;
let downItems = 0;

function onPacket(d: Device, type: number, flags: number, buf: Buffer, start: number, len: number): void {
  switch (type) {
    case CONNACK:
      if (d.phase !== Phase.Connecting) return;
      if (buf[start + 1] !== 0) {
        d.sock?.destroy();
        return;
      }
      d.connackAt = performance.now();
      d.phase = Phase.Subscribing;
      write(d, subscribePacket(nextPacketId(d), downFilter(d.spec.id)));
      return;
    case SUBACK:
      if (d.phase !== Phase.Subscribing) return;
      if (buf[start + 2] === 0x80) {
        d.sock?.destroy();
        return;
      }
      d.phase = Phase.Hello;
      write(d, publishPacket(Buffer.from(topicFor(d.spec.id, 'state')), encode('state', 'online'), 0, 0, true));
      write(d, publishPacket(Buffer.from(topicFor(d.spec.id, 'up/hello')), helloPayload(d), 1, nextPacketId(d)));
      return;
    case PUBLISH: {
      const qos = (flags >> 1) & 3;
      const topicLen = buf.readUInt16BE(start);
      const topic = buf.toString('latin1', start + 2, start + 2 + topicLen);
      let at = start + 2 + topicLen;
      if (qos > 0) {
        write(d, pubackPacket(buf.readUInt16BE(at)));
        at += 2;
      }
      const payload = buf.subarray(at, start + len);
      if (topic.endsWith('/down/acks')) onAcks(d, payload);
      else if (topic.endsWith('/down/vars')) onVars(d, payload);
      return;
    }
    default:
      // PUBACK, PINGRESP: nothing to do.
      return;
  }
}

function onVars(d: Device, payload: Buffer): void {
  const msg = JSON.parse(payload.toString()) as { items: VarItem[]; now?: number };
  if (d.phase === Phase.Hello && msg.now !== undefined) {
    d.readyAt = performance.now();
    settle(d, Phase.Ready);
  }
  if (msg.items.length > 0) {
    // An agent acknowledges after its commit; this one holds nothing.
    downItems += msg.items.length;
    write(d, publishPacket(Buffer.from(topicFor(d.spec.id, 'up/acks')), acksPayload(msg.items), 1, nextPacketId(d)));
  }
}

function onAcks(d: Device, payload: Buffer): void {
  const msg = JSON.parse(payload.toString()) as { acks: Array<{ time: number }> };
  const at = performance.now();
  for (const a of msg.acks) {
    const due = d.pending?.get(a.time);
    if (due === undefined) continue;
    d.pending!.delete(a.time);
    pushRun?.acked(due, at);
  }
}

// ---- pushing ----

interface PushRun {
  acked(due: number, at: number): void;
}

function pushAll(req: Extract<SimRequest, { op: 'push' }>): Promise<PushReport> {
  const ready = devices.filter((d) => d.phase === Phase.Ready);
  const interval = 1000 / req.rate;
  const start = performance.now() + 10;
  const from = start + req.warmupMs;
  const to = from + req.durationMs;
  const total = ready.length === 0 ? 0 : Math.round(((req.warmupMs + req.durationMs) / 1000) * req.rate);
  const latencies: number[] = [];
  const lags: number[] = [];
  let sent = 0;
  let sentTotal = 0;
  let ackedTotal = 0;
  let next = 0;
  let rr = 0;
  const downBefore = downItems;
  // With stamped values: when each measured one was acknowledged, and each device's last value.
  const ackedAt: Record<string, number> = {};
  const lastValues: Record<string, string> = {};
  // With spikes: each spike, and the one due at each due time (which its acknowledgement names).
  const spikes: SpikeMark[] = [];
  const spikeAt = new Map<number, SpikeMark>();
  const rand = req.spikes ? seeded(req.spikes.seed) : undefined;
  const keyOf = (n: number, measured: boolean) => `${measured ? 'm' : 'w'}${init.index}.${n}`;
  pushRun = {
    acked(due, at) {
      ackedTotal++;
      if (due >= from && due < to) {
        latencies.push(at - due);
        // Push n (from 1) was due at start + (n - 1) × interval.
        if (req.stamp) ackedAt[keyOf(Math.round((due - start) / interval) + 1, true)] = performance.timeOrigin + at;
      }
      const spike = spikeAt.get(due);
      if (spike) spike.acked = performance.timeOrigin + at;
    },
  };
  for (const d of ready) d.pending ??= new Map();
  return new Promise((resolve) => {
    const finish = () => {
      pushRun = undefined;
      for (const d of ready) d.pending?.clear();
      lags.sort((a, b) => a - b);
      resolve({
        sent,
        acked: latencies.length,
        latencies,
        sentTotal,
        ackedTotal,
        lagP99Ms: lags.length > 0 ? lags[Math.min(lags.length - 1, Math.ceil(lags.length * 0.99) - 1)]! : 0,
        lagMaxMs: lags.length > 0 ? lags[lags.length - 1]! : 0,
        ready: ready.length,
        lost,
        downItems: downItems - downBefore,
        ...(req.stamp && { ackedAt, lastValues }),
        ...(req.spikes && { spikes }),
      });
    };
    const drain = () => {
      const deadline = performance.now() + req.drainMs;
      const check = () => {
        if (latencies.length >= sent || performance.now() > deadline) finish();
        else setTimeout(check, 5);
      };
      check();
    };
    const tick = () => {
      const now = performance.now();
      if (next < total && start + next * interval <= now) lags.push(now - (start + next * interval));
      while (next < total && start + next * interval <= now) {
        const due = start + next++ * interval;
        // Round robin over the devices, skipping one whose connection was lost.
        let d = ready[rr++ % ready.length]!;
        for (let k = 0; k < ready.length && d.phase !== Phase.Ready; k++) d = ready[rr++ % ready.length]!;
        if (d.phase !== Phase.Ready) continue;
        const time = Math.max(Date.now(), d.lastTime + 1);
        d.lastTime = time;
        d.pending!.set(time, due);
        d.varsTopic ??= Buffer.from(topicFor(d.spec.id, 'up/vars'));
        const measured = due >= from && due < to;
        let value = String(next);
        if (req.stamp) {
          const key = keyOf(next, measured);
          lastValues[d.spec.id] = key;
          value = `${key}@${(performance.timeOrigin + due).toFixed(3)}`;
        } else if (req.spikes && rand) {
          const s = req.spikes;
          const n = ++valueSeq;
          if (rand() < s.fraction) {
            value = `${d.spikes++ % 2 === 0 ? s.high : s.low}.${n}`;
            const mark: SpikeMark = {
              deviceId: d.spec.id,
              value,
              due: performance.timeOrigin + due,
              acked: undefined,
              measured,
            };
            spikes.push(mark);
            spikeAt.set(due, mark);
          } else value = `${s.normal}.${n}`;
        }
        write(d, publishPacket(d.varsTopic, pushPayload(time, value), 1, nextPacketId(d)));
        sentTotal++;
        if (measured) sent++;
      }
      if (next < total) setTimeout(tick, Math.max(0, start + next * interval - performance.now()));
      else drain();
    };
    setTimeout(tick, Math.max(0, start - performance.now()));
  });
}

// ---- keepalive and timeouts: one sweep a second for all devices ----

setInterval(() => {
  const now = performance.now();
  for (const d of devices) {
    if (d.phase === Phase.Ready && now - d.lastWrite >= keepaliveMs - 1500) write(d, PINGREQ_PACKET);
    else if (
      connectRun &&
      (d.phase === Phase.Connecting || d.phase === Phase.Subscribing || d.phase === Phase.Hello) &&
      now - d.attemptStart > connectRun.timeoutMs
    ) {
      d.sock?.destroy();
    }
  }
}, 1000).unref();

function disconnectAll(): Promise<void> {
  const open = devices.filter((d) => d.sock !== undefined);
  return new Promise((resolve) => {
    let left = open.length;
    if (left === 0) resolve();
    const timer = setTimeout(resolve, 5000);
    for (const d of open) {
      const sock = d.sock!;
      d.phase = Phase.Closing;
      sock.once('close', () => {
        if (--left === 0) {
          clearTimeout(timer);
          resolve();
        }
      });
      sock.end(DISCONNECT_PACKET);
    }
  });
}

checkPayloads();

process.on('message', (m: SimRequest & { seq: number }) => {
  const reply = (work: Promise<unknown>) => replyTo(m.seq, work);
  switch (m.op) {
    case 'connect':
      reply(connectAll(m));
      return;
    case 'push':
      reply(pushAll(m));
      return;
    case 'disconnect':
      reply(disconnectAll());
      return;
  }
});
// The benchmark's process went away: so does this one.
process.on('disconnect', () => process.exit(0));
