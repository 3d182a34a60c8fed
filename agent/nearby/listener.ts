/**
 * The nearby listener (decisions 18 and 19): phones and laptops broadcast their user's authcode to UDP
 * port 590; the agent reports each authcode it hears on `up/heard`, at most once per `dedupeMs`. Anything that
 * is not an authcode is ignored and counted. A port that cannot be bound is one clear log line, and the rest of
 * the agent keeps running.
 */
import { type Socket, createSocket } from 'node:dgram';
import type { Logger } from '../../lib/log.js';
import { redactCode } from '../../lib/log.js';

/** Decision 19: 8 to 128 hex digits, with an optional trailing newline (`\n` or `\r\n`). */
const DATAGRAM_RE = /^([0-9A-Fa-f]{8,128})(\r?\n)?$/;
/** Longest datagram that can hold an authcode; larger ones are rejected before any decoding. */
const MAX_DATAGRAM = 130;
/** Bound on the dedupe table, so that a flood of random codes cannot grow memory. */
const MAX_TRACKED = 10_000;

/** The lower-case authcode in a datagram, or `undefined` when it is not one. */
export function parseAuthcodeDatagram(msg: Buffer): string | undefined {
  if (msg.length < 8 || msg.length > MAX_DATAGRAM) return undefined;
  const m = DATAGRAM_RE.exec(msg.toString('latin1'));
  return m ? m[1]!.toLowerCase() : undefined;
}

export interface NearbyOptions {
  port: number;
  ipv6: boolean;
  dedupeMs: number;
  /** When a code was heard, as reported (the cloud's clock as the agent knows it). */
  now: () => number;
  /** Times the once-per-`dedupeMs` rule, so that a step of the wall clock cannot silence it (`now` without it). */
  monotonic?: () => number;
  log: Logger;
  onHeard: (authcode: string, at: number) => void;
}

export class NearbyListener {
  private readonly sockets: Socket[] = [];
  private readonly lastReported = new Map<string, number>();
  readonly counters = { received: 0, ignored: 0, reported: 0, repeated: 0 };
  /** The port actually bound (differs from the option when it is 0), or `undefined` when not listening. */
  port: number | undefined;

  constructor(private readonly opts: NearbyOptions) {}

  /** Binds IPv4 (broadcasts included) and, when asked, IPv6. Never throws: failures are logged. */
  async start(): Promise<void> {
    const v4 = await this.bind('udp4', this.opts.port);
    if (v4 === undefined) return;
    this.port = v4;
    if (this.opts.ipv6) await this.bind('udp6', v4);
    this.opts.log.info({ event: 'nearby.listening', port: v4, ipv6: this.sockets.length > 1 });
  }

  stop(): void {
    for (const s of this.sockets.splice(0)) s.close();
    this.port = undefined;
  }

  get listening(): boolean {
    return this.port !== undefined;
  }

  private bind(family: 'udp4' | 'udp6', port: number): Promise<number | undefined> {
    return new Promise((resolve) => {
      const socket = createSocket({ type: family, ipv6Only: family === 'udp6', reuseAddr: false });
      socket.once('error', (err: NodeJS.ErrnoException) => {
        socket.close();
        this.bindFailed(family, port, err);
        resolve(undefined);
      });
      socket.bind({ port, address: family === 'udp4' ? '0.0.0.0' : '::', exclusive: true }, () => {
        socket.removeAllListeners('error');
        socket.on('error', (err) => this.opts.log.warn({ event: 'nearby.error', err: err.message }));
        if (family === 'udp4') socket.setBroadcast(true);
        socket.on('message', (msg, rinfo) => this.onMessage(msg, rinfo.address));
        this.sockets.push(socket);
        resolve(socket.address().port);
      });
    });
  }

  private bindFailed(family: 'udp4' | 'udp6', port: number, err: NodeJS.ErrnoException): void {
    const log = this.opts.log;
    if (family === 'udp6') {
      // A gateway without IPv6 still hears IPv4 broadcasts; say so once, calmly.
      log.warn({ event: 'nearby.ipv6_unavailable', port, code: err.code, msg: 'listening on IPv4 only' });
      return;
    }
    const why =
      err.code === 'EACCES'
        ? 'permission denied'
        : err.code === 'EADDRINUSE'
          ? 'another program already uses the port'
          : err.message;
    // Every remedy on the one line, whatever the cause: the engineer reading it may pick another port, and
    // ports below 1024 need the capability too.
    log.error({
      event: 'nearby.bind_failed',
      port,
      code: err.code,
      msg: `cannot listen for user authcodes on UDP port ${port}: ${why}. Ports below 1024 need CAP_NET_BIND_SERVICE (the systemd unit grants it) or root; choose another port with --udp-port N. Nearby discovery is off, everything else keeps running.`,
    });
  }

  private onMessage(msg: Buffer, from: string): void {
    this.counters.received++;
    const code = parseAuthcodeDatagram(msg);
    if (code === undefined) {
      this.counters.ignored++;
      this.opts.log.debug({ event: 'nearby.ignored', from, bytes: msg.length });
      return;
    }
    const mono = (this.opts.monotonic ?? this.opts.now)();
    const last = this.lastReported.get(code);
    if (last !== undefined && mono - last < this.opts.dedupeMs) {
      this.counters.repeated++;
      return;
    }
    if (this.lastReported.size >= MAX_TRACKED) this.prune(mono);
    this.lastReported.set(code, mono);
    this.counters.reported++;
    this.opts.log.debug({ event: 'nearby.heard', code: redactCode(code), from });
    this.opts.onHeard(code, this.opts.now());
  }

  private prune(now: number): void {
    for (const [code, at] of this.lastReported) if (now - at >= this.opts.dedupeMs) this.lastReported.delete(code);
    // Still full of fresh codes: forget the oldest half rather than grow.
    if (this.lastReported.size >= MAX_TRACKED) {
      let n = 0;
      for (const code of this.lastReported.keys()) {
        if (n++ >= MAX_TRACKED / 2) break;
        this.lastReported.delete(code);
      }
    }
  }
}
