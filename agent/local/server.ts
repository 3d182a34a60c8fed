/**
 * The Unix socket server of the local interface. Requests are parsed at the edge; a bad line gets an error
 * response and the connection stays open; a client that stops reading is disconnected rather than buffered
 * without bound.
 */
import { chmodSync, unlinkSync } from 'node:fs';
import { type Server, type Socket, connect, createServer } from 'node:net';
import { dirname } from 'node:path';
import { mkdirSync } from 'node:fs';
import type { Logger, LogLevel } from '../../lib/log.js';
import { isStorageFull } from '../../lib/sqlite.js';
import { VAR_NAME_RE } from '../../protocol/index.js';
import { AgentError, isAgentError } from '../errors.js';
import type { FirmwareUpdater } from '../fw/updater.js';
import type { VarSync } from '../vars/sync.js';
import { LocalRequest, type LocalResponse, MAX_LINE_BYTES, type WatchEvent, varJson } from './messages.js';

export interface LocalApi {
  vars: VarSync;
  status(): unknown;
  queue(recent: number): unknown;
  firmware: Pick<FirmwareUpdater, 'status' | 'commit' | 'rollback'>;
  setLogLevel(level: LogLevel): void;
}

/** Output a slow client may leave unread before it is disconnected. */
const MAX_BUFFERED_BYTES = 16 * 1024 * 1024;

export class SocketInUseError extends Error {
  override name = 'SocketInUseError';
}

export class LocalServer {
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();
  private readonly watchers = new Set<Socket>();
  private accepting = true;

  constructor(
    private readonly path: string,
    private readonly mode: number,
    private readonly api: LocalApi,
    private readonly log: Logger,
  ) {
    // Every change and every ack passes here: build the event only when someone watches.
    api.vars.on('change', ({ record, source }) => {
      if (this.watchers.size > 0) this.broadcast({ event: 'change', source, var: varJson(record) });
    });
    api.vars.on('stamp', ({ type, name, stamp }) => {
      if (this.watchers.size === 0) return;
      const record = api.vars.record(type, name);
      if (record) this.broadcast({ event: stamp, var: varJson(record) });
    });
  }

  async start(): Promise<void> {
    mkdirSync(dirname(this.path), { recursive: true });
    if (await isListening(this.path)) {
      throw new SocketInUseError(`another agent is serving ${this.path}; stop it or pass --socket`);
    }
    try {
      unlinkSync(this.path);
    } catch {
      // no stale socket
    }
    const server = createServer((socket) => this.onConnection(socket));
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.path, () => {
        server.off('error', reject);
        resolve();
      });
    });
    chmodSync(this.path, this.mode);
    server.on('error', (err) => this.log.error({ event: 'local.error', err: err.message }));
    this.log.info({ event: 'local.listening', path: this.path, mode: this.mode.toString(8) });
  }

  /** Stops accepting requests; open connections get `unavailable` from now on. */
  stopAccepting(): void {
    this.accepting = false;
    this.server?.close();
  }

  async close(): Promise<void> {
    this.stopAccepting();
    for (const s of this.sockets) s.destroy();
    const server = this.server;
    this.server = undefined;
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
    try {
      unlinkSync(this.path);
    } catch {
      // already gone
    }
  }

  private onConnection(socket: Socket): void {
    this.sockets.add(socket);
    let buffered = '';
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => {
      buffered += chunk;
      let nl: number;
      while ((nl = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        if (line.trim().length > 0) this.onLine(socket, line);
      }
      if (Buffer.byteLength(buffered) > MAX_LINE_BYTES) {
        this.reply(socket, { id: null, ok: false, error: { code: 'bad-request', message: 'request line too long' } });
        this.log.warn({ event: 'local.drop', reason: 'request line too long' });
        socket.end();
        buffered = '';
      }
    });
    socket.on('error', () => socket.destroy());
    socket.on('close', () => {
      this.sockets.delete(socket);
      this.watchers.delete(socket);
    });
  }

  private onLine(socket: Socket, line: string): void {
    let raw: unknown;
    try {
      raw = JSON.parse(line);
    } catch {
      this.reply(socket, { id: null, ok: false, error: { code: 'bad-request', message: 'not JSON' } });
      return;
    }
    const id = typeof raw === 'object' && raw !== null && 'id' in raw ? idOf(raw.id) : null;
    const parsed = LocalRequest.safeParse(raw);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      const where = issue && issue.path.length > 0 ? `${issue.path.join('.')}: ` : '';
      this.reply(socket, { id, ok: false, error: { code: 'bad-request', message: `${where}${issue?.message}` } });
      return;
    }
    if (!this.accepting) {
      this.reply(socket, { id, ok: false, error: { code: 'unavailable', message: 'the agent is shutting down' } });
      return;
    }
    this.handle(socket, parsed.data).then(
      (result) => this.reply(socket, { id: parsed.data.id, ok: true, result }),
      (err: unknown) => {
        // A full disk is logged once as `storage.full` when writes start failing, not once per request.
        const full = !isAgentError(err) && isStorageFull(err);
        if (!isAgentError(err) && !full)
          this.log.error({ event: 'local.failed', op: parsed.data.op, err: String(err) });
        const e = isAgentError(err)
          ? err
          : full
            ? new AgentError('storage-full', 'the disk of the state directory is full; nothing was changed')
            : new AgentError('internal', 'internal error');
        this.reply(socket, { id: parsed.data.id, ok: false, error: { code: e.code, message: e.message } });
      },
    );
  }

  private async handle(socket: Socket, req: LocalRequest): Promise<unknown> {
    const vars = this.api.vars;
    switch (req.op) {
      case 'list':
        return vars.list(req.type).map(varJson);
      case 'get': {
        // Like set, rm and sync: a name that can never exist is the caller's mistake, not a missing variable.
        if (!VAR_NAME_RE.test(req.name)) {
          throw new AgentError('bad-name', `not a valid variable name: ${JSON.stringify(req.name)}`);
        }
        const rec = vars.get(req.type, req.name);
        if (!rec) throw new AgentError('not-found', `no ${req.type} variable ${req.name}`);
        return varJson(rec);
      }
      case 'set': {
        const value = req.value64 !== undefined ? Buffer.from(req.value64, 'base64') : Buffer.from(req.value!, 'utf8');
        return varJson(await vars.set(req.type, req.name, value));
      }
      case 'rm':
        return varJson(await vars.remove(req.type, req.name));
      case 'sync':
        return varJson(await vars.sync(req.type, req.name));
      case 'watch':
        this.watchers.add(socket);
        return { watching: true };
      case 'status':
        return this.api.status();
      case 'queue':
        return this.api.queue(req.recent);
      case 'log-level':
        this.api.setLogLevel(req.level);
        this.log.info({ event: 'log.level_changed', level: req.level });
        return { level: req.level };
      case 'fw-status':
        return this.api.firmware.status();
      case 'fw-commit':
      case 'fw-rollback': {
        const fw = this.api.firmware;
        const r = req.op === 'fw-commit' ? fw.commit() : fw.rollback(req.reason);
        if (!r.ok) throw new AgentError('refused', r.why ?? 'refused');
        return fw.status();
      }
    }
  }

  private reply(socket: Socket, res: LocalResponse): void {
    this.write(socket, JSON.stringify(res));
  }

  private broadcast(ev: WatchEvent): void {
    if (this.watchers.size === 0) return;
    const line = JSON.stringify(ev);
    for (const s of this.watchers) this.write(s, line);
  }

  private write(socket: Socket, line: string): void {
    if (socket.destroyed) return;
    if (socket.writableLength > MAX_BUFFERED_BYTES) {
      this.log.warn({ event: 'local.slow_client', reason: 'client stopped reading; disconnected' });
      socket.destroy();
      return;
    }
    // Replies to a pipelined batch resolve together after one commit; send them in one write.
    if (!socket.writableCorked) {
      socket.cork();
      process.nextTick(() => socket.uncork());
    }
    socket.write(`${line}\n`);
  }
}

function idOf(v: unknown): string | number | null {
  return typeof v === 'string' || typeof v === 'number' ? v : null;
}

/** Whether something answers on the socket path (another agent). */
function isListening(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(path);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}
