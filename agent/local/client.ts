/**
 * A client of the local interface, used by the CLI, by gateway applications written for Node, and by the
 * tests and benchmarks. Requests may be pipelined: each resolves with its own response.
 */
import { type Socket, connect } from 'node:net';
import type { LocalResponse, QueueJson, VarJson, WatchEvent } from './messages.js';

export class LocalClientError extends Error {
  override name = 'LocalClientError';
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

type Waiter = { resolve: (v: unknown) => void; reject: (e: Error) => void };

export class LocalClient {
  private nextId = 1;
  private readonly waiting = new Map<number, Waiter>();
  private buffered = '';
  private onEvent: ((ev: WatchEvent) => void) | undefined;
  /** Resolves when the connection to the agent is gone. */
  readonly closed: Promise<void>;

  private constructor(private readonly socket: Socket) {
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => this.onData(chunk));
    this.closed = new Promise((resolve) => socket.once('close', () => resolve()));
    socket.on('close', () => {
      for (const w of this.waiting.values())
        w.reject(new LocalClientError('closed', 'the agent closed the connection'));
      this.waiting.clear();
    });
    socket.on('error', () => undefined);
  }

  static connect(path: string): Promise<LocalClient> {
    return new Promise((resolve, reject) => {
      const socket = connect(path);
      socket.once('connect', () => {
        socket.removeAllListeners('error');
        resolve(new LocalClient(socket));
      });
      socket.once('error', (err) =>
        reject(new LocalClientError('unreachable', `cannot reach the agent at ${path}: ${err.message}`)),
      );
    });
  }

  request<T = unknown>(req: Record<string, unknown>): Promise<T> {
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      this.waiting.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.socket.write(`${JSON.stringify({ ...req, id })}\n`);
    });
  }

  list(type: 'd' | 's' = 'd'): Promise<VarJson[]> {
    return this.request({ op: 'list', type });
  }
  get(type: 'd' | 's', name: string): Promise<VarJson> {
    return this.request({ op: 'get', type, name });
  }
  set(type: 'd' | 's', name: string, value: string | Buffer): Promise<VarJson> {
    return typeof value === 'string'
      ? this.request({ op: 'set', type, name, value })
      : this.request({ op: 'set', type, name, value64: value.toString('base64') });
  }
  rm(type: 'd' | 's', name: string): Promise<VarJson> {
    return this.request({ op: 'rm', type, name });
  }
  sync(type: 'd' | 's', name: string): Promise<VarJson> {
    return this.request({ op: 'sync', type, name });
  }
  queue(recent = 20): Promise<QueueJson> {
    return this.request({ op: 'queue', recent });
  }
  status<T = Record<string, unknown>>(): Promise<T> {
    return this.request({ op: 'status' });
  }
  fwStatus(): Promise<Record<string, unknown>> {
    return this.request({ op: 'fw-status' });
  }
  fwCommit(): Promise<Record<string, unknown>> {
    return this.request({ op: 'fw-commit' });
  }
  fwRollback(reason?: string): Promise<Record<string, unknown>> {
    return this.request({ op: 'fw-rollback', ...(reason ? { reason } : {}) });
  }
  /** Follows changes and acknowledgements; resolves once the agent has registered the watch. */
  async watch(onEvent: (ev: WatchEvent) => void): Promise<void> {
    this.onEvent = onEvent;
    await this.request({ op: 'watch' });
  }

  close(): void {
    this.socket.end();
  }

  private onData(chunk: string): void {
    this.buffered += chunk;
    let nl: number;
    while ((nl = this.buffered.indexOf('\n')) >= 0) {
      const line = this.buffered.slice(0, nl);
      this.buffered = this.buffered.slice(nl + 1);
      let msg: LocalResponse | WatchEvent;
      try {
        msg = JSON.parse(line) as LocalResponse | WatchEvent;
      } catch {
        continue;
      }
      if ('event' in msg) {
        this.onEvent?.(msg);
        continue;
      }
      const waiter = typeof msg.id === 'number' ? this.waiting.get(msg.id) : undefined;
      if (!waiter) continue;
      this.waiting.delete(msg.id as number);
      if (msg.ok) waiter.resolve(msg.result);
      else waiter.reject(new LocalClientError(msg.error.code, msg.error.message));
    }
  }
}
