/**
 * Synchronisation of the gateway's variables with the cloud, exactly as docs/decisions.md §3 says:
 *
 * - A change made on the gateway is committed, then pushed on `up/vars`; the cloud's ack on `down/acks` sets
 *   `acked`. A re-send without change (explicit, or the catch-up after start) is a sync; its ack sets
 *   `syncacked`.
 * - A version from the cloud on `down/vars` is committed (if newer), then acknowledged on `up/acks`. The same
 *   version twice, or an older one, changes nothing and is acknowledged again.
 * - What the cloud has not acknowledged is sent again after every reconnect, and while connected after
 *   `retryMs`, until it is. A start resumes from the stamps: what the cloud acknowledged is not sent again,
 *   unless the database was restored (`fullSyncOnStart`; docs/sync.md, offline and catch-up).
 */
import { EventEmitter } from 'node:events';
import type { Logger } from '../../lib/log.js';
import type { GroupCommitter, RunOptions } from '../../lib/sqlite.js';
import {
  type AckItem,
  type AcksMessage,
  type Payloads,
  type UpTopic,
  type VarItem,
  type VarsMessage,
  VAR_NAME_RE,
  ackFor,
  chunkVarItems,
  decodeValue,
  messageId,
  varItem,
} from '../../protocol/index.js';
import { AgentError } from '../errors.js';
import type { PageKey, VarRecord, VarStore, VarType } from './store.js';

/** What the sync engine needs of the uplink. */
export interface UplinkPort {
  readonly connected: boolean;
  publish<K extends Exclude<UpTopic, 'state'>>(name: K, payload: Payloads[K]): boolean;
}

export interface SyncOptions {
  batchSize: number;
  retryMs: number;
  maxValueBytes: number;
  /** Stamps versions: the cloud's clock as the agent knows it (decision 24). */
  now: () => number;
  /** Times the retry: steps of the wall clock must not hold it up (`now` without it). */
  monotonic?: () => number;
  log: Logger;
  /** Sync every `d` variable on the first connect (a restored database); otherwise only what is pending. */
  fullSyncOnStart?: boolean;
}

export interface ChangeEvent {
  record: VarRecord;
  /** Who made the change: a gateway application (`local`) or the cloud. */
  source: 'local' | 'cloud';
}

export interface StampEvent {
  type: VarType;
  name: string;
  stamp: 'acked' | 'syncacked';
  /** The new value of the stamp. */
  at: number;
}

interface SyncEvents {
  change: [ChangeEvent];
  stamp: [StampEvent];
}

type Kind = 'push' | 'sync';

/** Rows read and sent at a time by catch-up, retry and full sync. */
const PAGE = 500;

/** Lets the event loop send what was queued (and serve others) before the next page is read. */
const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));

const keyOf = (kind: Kind, type: VarType, name: string) => `${kind}:${type}/${name}`;

export class VarSync extends EventEmitter<SyncEvents> {
  private readonly outVars = new Map<string, VarItem>();
  private outAcks: AckItem[] = [];
  private flushScheduled = false;
  /** When each push or sync was last sent, for the retry while connected. */
  private readonly sentAt = new Map<string, number>();
  private retryTimer: NodeJS.Timeout | undefined;
  /** `false` while a full sync is due on the next connect. */
  private syncedSinceStart: boolean;
  /** Counts connects and disconnects, so that paged work for a connection that is gone stops. */
  private connection = 0;
  private retrying = false;
  private closed = false;
  readonly counters = { pushed: 0, synced: 0, acksSent: 0, acksReceived: 0, applied: 0, ignored: 0, dropped: 0 };

  constructor(
    private readonly store: VarStore,
    private readonly commit: GroupCommitter,
    private readonly uplink: UplinkPort,
    private readonly opts: SyncOptions,
  ) {
    super();
    this.syncedSinceStart = opts.fullSyncOnStart !== true;
  }

  // ---- the local interface -------------------------------------------------------------------------------

  get(type: VarType, name: string): VarRecord | undefined {
    const rec = this.store.get(type, name);
    return rec && rec.value !== null ? rec : undefined;
  }

  /** The record as stored, tombstones included. */
  record(type: VarType, name: string): VarRecord | undefined {
    return this.store.get(type, name);
  }

  list(type: VarType): VarRecord[] {
    return this.store.list(type);
  }

  /** Sets a variable on the gateway; resolves once the change is on disk. */
  async set(type: VarType, name: string, value: Buffer): Promise<VarRecord> {
    this.checkName(name);
    if (value.length > this.opts.maxValueBytes) {
      throw new AgentError('too-large', `value of ${value.length} bytes exceeds ${this.opts.maxValueBytes}`);
    }
    const rec = await this.run(() => this.store.setLocal(type, name, value, this.opts.now()));
    this.afterLocalChange(rec!);
    return rec!;
  }

  /** Deletes a variable (a tombstone, synchronised like a value); `not-found` when there is none. */
  async remove(type: VarType, name: string): Promise<VarRecord> {
    this.checkName(name);
    const rec = await this.run(() => this.store.setLocal(type, name, null, this.opts.now()));
    if (!rec) throw new AgentError('not-found', `no ${type} variable ${name}`);
    this.afterLocalChange(rec);
    return rec;
  }

  /** Re-sends the current version of a `d` variable without changing it; the cloud's ack sets `syncacked`. */
  async sync(type: VarType, name: string): Promise<VarRecord> {
    this.checkName(name);
    if (type !== 'd') throw new AgentError('bad-request', 'only d variables are synchronised');
    const rec = await this.run(() => this.store.markSynced(type, name, this.opts.now()));
    if (!rec) throw new AgentError('not-found', `no ${type} variable ${name}`);
    this.queue(rec, 'sync');
    return rec;
  }

  /** Syncs every `d` variable, tombstones included: the catch-up after start or on the cloud's request. */
  async syncAll(): Promise<number> {
    let after = '';
    let count = 0;
    for (;;) {
      const records = await this.run(() => {
        const now = this.opts.now();
        return this.store.allPage('d', after, PAGE).map((r) => this.store.markSynced(r.type, r.name, now)!);
      });
      for (const rec of records) this.queue(rec, 'sync');
      count += records.length;
      if (records.length < PAGE) break;
      after = records[records.length - 1]!.name;
      await nextTurn();
    }
    if (count > 0) this.opts.log.info({ event: 'vars.sync_all', count });
    return count;
  }

  /** Nothing waits for the cloud: every version and sync is acknowledged and nothing is left to send. */
  isSettled(): boolean {
    const pending = this.store.pendingCounts();
    return pending.pushes === 0 && pending.syncs === 0 && this.outVars.size === 0 && this.outAcks.length === 0;
  }

  pending(): { pushes: number; syncs: number } {
    return this.store.pendingCounts();
  }

  // ---- the uplink ----------------------------------------------------------------------------------------

  /**
   * Called on every connect: sends again what the cloud has not acknowledged, and everything when a full sync is
   * due (a restored database, a deadleaf wake).
   */
  onConnected(): void {
    this.connection++;
    this.sentAt.clear();
    this.catchUp(this.connection).catch((err: unknown) => this.failed('vars.catch_up_failed', err));
    this.startRetry();
  }

  private async catchUp(connection: number): Promise<void> {
    const sent = await this.resendPending(connection, () => true);
    if (sent.push + sent.sync > 0) this.opts.log.info({ event: 'vars.catch_up', pushes: sent.push, syncs: sent.sync });
    if (!this.syncedSinceStart && connection === this.connection) {
      this.syncedSinceStart = true;
      await this.syncAll();
    }
  }

  /**
   * Sends again what waits for the cloud's acknowledgement and passes `due`, a page at a time, each page sent
   * before the next is read. Stops when the connection it was started for is gone.
   */
  private async resendPending(connection: number, due: (key: string) => boolean): Promise<Record<Kind, number>> {
    const sent: Record<Kind, number> = { push: 0, sync: 0 };
    for (const kind of ['push', 'sync'] as const) {
      let after: PageKey | undefined;
      for (;;) {
        if (connection !== this.connection || this.closed || !this.uplink.connected) return sent;
        const page = kind === 'push' ? this.store.unacked(after, PAGE) : this.store.unsynced(after, PAGE);
        for (const rec of page) {
          if (!due(keyOf(kind, rec.type, rec.name))) continue;
          this.queue(rec, kind);
          sent[kind]++;
        }
        if (page.length < PAGE) break;
        after = page[page.length - 1];
        await nextTurn();
      }
    }
    return sent;
  }

  onDisconnected(): void {
    this.connection++;
    clearInterval(this.retryTimer);
    this.retryTimer = undefined;
    this.outVars.clear();
    this.outAcks = [];
  }

  /** A deadleaf wake syncs everything again. */
  resyncOnNextConnect(): void {
    this.syncedSinceStart = false;
  }

  handleVars(msg: VarsMessage): void {
    for (const item of msg.items) {
      if (item.type !== 'd') {
        // s variables live on the server; the cloud never pushes them (docs/decisions.md §3).
        this.counters.dropped++;
        this.opts.log.warn({
          event: 'vars.drop',
          msgId: msg.id,
          name: item.name,
          reason: 's variables are not pushed to devices',
        });
        continue;
      }
      this.applyRemote(item);
    }
    if (msg.resync) this.syncAll().catch((err: unknown) => this.failed('vars.sync_all_failed', err));
  }

  handleAcks(msg: AcksMessage): void {
    this.counters.acksReceived += msg.acks.length;
    const now = this.opts.now();
    // One unit for the whole message, committed without fsync: a stamp lost in a crash only means the version
    // is pushed again and acknowledged again.
    this.run(
      () =>
        msg.acks.map((ack) =>
          ack.kind === 'push' ? this.store.markAcked(ack, now) : this.store.markSyncAcked(ack, now),
        ),
      { durable: false },
    ).then(
      (stamps) => {
        stamps.forEach((at, i) => {
          if (at === undefined) return;
          const ack = msg.acks[i]!;
          this.sentAt.delete(keyOf(ack.kind, ack.type, ack.name));
          this.emit('stamp', {
            type: ack.type,
            name: ack.name,
            stamp: ack.kind === 'push' ? 'acked' : 'syncacked',
            at,
          });
        });
      },
      (err: unknown) => this.failed('vars.ack_commit_failed', err),
    );
  }

  close(): void {
    this.closed = true;
    this.onDisconnected();
  }

  // ---- internals ---------------------------------------------------------------------------------------

  private applyRemote(item: VarItem): void {
    const value = decodeValue(item);
    const version = {
      time: item.time,
      origin: item.origin,
      ...(item.replaces === undefined ? {} : { replaces: item.replaces }),
    };
    this.run(() => {
      const result = this.store.applyRemote(item.type, item.name, value, version, this.opts.now());
      // A sync of an older version means the cloud lacks ours: clear our ack so that ours is pushed again.
      if (result.outcome === 'older' && item.kind === 'sync' && result.record) this.store.unack(item.type, item.name);
      return result;
    }).then(
      ({ outcome, record }) => {
        // Acknowledged only now that the commit is on disk.
        const ack = ackFor(item);
        this.queueAck(ack);
        if (outcome === 'applied' && record) {
          this.counters.applied++;
          this.opts.log.debug({ event: 'vars.applied', name: item.name, versionTime: item.time, kind: item.kind });
          this.emit('change', { record, source: 'cloud' });
        } else {
          this.counters.ignored++;
          if (outcome === 'older' && item.kind === 'sync' && record) this.queue({ ...record, acked: 0 }, 'push');
        }
      },
      (err: unknown) => this.failed('vars.commit_failed', err),
    );
  }

  private afterLocalChange(rec: VarRecord): void {
    this.opts.log.debug({ event: 'vars.local_change', type: rec.type, name: rec.name, versionTime: rec.time });
    this.queue(rec, 'push');
    this.emit('change', { record: rec, source: 'local' });
  }

  private queue(rec: VarRecord, kind: Kind): void {
    if (this.closed || !this.uplink.connected) return;
    this.outVars.set(keyOf(kind, rec.type, rec.name), varItem(rec, kind));
    this.scheduleFlush();
  }

  private queueAck(ack: AckItem): void {
    if (this.closed || !this.uplink.connected) return;
    this.outAcks.push(ack);
    this.scheduleFlush();
  }

  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    // After the commits of this turn have resolved and the I/O callbacks have run, so that one message
    // carries many items.
    setImmediate(() => this.flushOut());
  }

  private flushOut(): void {
    this.flushScheduled = false;
    if (!this.uplink.connected) {
      this.outVars.clear();
      this.outAcks = [];
      return;
    }
    const now = (this.opts.monotonic ?? this.opts.now)();
    const size = this.opts.batchSize;
    const items = [...this.outVars.entries()];
    this.outVars.clear();
    // At most batchSize items, and well under the receiver's payload limit: a catch-up may hold many large values,
    // and a message over the limit would be dropped and sent again the same way forever.
    for (const chunk of chunkVarItems(items, size, ([, item]) => item)) {
      if (!this.uplink.publish('up/vars', { id: messageId(), items: chunk.map(([, item]) => item) })) return;
      for (const [key, item] of chunk) {
        this.sentAt.set(key, now);
        if (item.kind === 'push') this.counters.pushed++;
        else this.counters.synced++;
      }
    }
    const acks = this.outAcks;
    this.outAcks = [];
    for (let i = 0; i < acks.length; i += size) {
      if (!this.uplink.publish('up/acks', { id: messageId(), acks: acks.slice(i, i + size) })) return;
      this.counters.acksSent += Math.min(size, acks.length - i);
    }
  }

  private startRetry(): void {
    clearInterval(this.retryTimer);
    const every = Math.max(250, Math.floor(this.opts.retryMs / 2));
    this.retryTimer = setInterval(() => this.retry(), every);
    this.retryTimer.unref();
  }

  /** While connected, sends again what has waited longer than `retryMs` (the cloud may have restarted). */
  private retry(): void {
    if (!this.uplink.connected || this.retrying) return;
    this.retrying = true;
    const now = (this.opts.monotonic ?? this.opts.now)();
    const due = (key: string) => now - (this.sentAt.get(key) ?? 0) >= this.opts.retryMs;
    this.resendPending(this.connection, due)
      .then((sent) => {
        if (sent.push + sent.sync > 0) this.opts.log.info({ event: 'vars.resend', count: sent.push + sent.sync });
      })
      .catch((err: unknown) => this.failed('vars.resend_failed', err))
      .finally(() => (this.retrying = false));
  }

  private run<T>(work: () => T, options?: RunOptions): Promise<T> {
    return this.commit.run(work, options);
  }

  private checkName(name: string): void {
    if (!VAR_NAME_RE.test(name)) throw new AgentError('bad-name', `not a valid variable name: ${JSON.stringify(name)}`);
  }

  private failed(event: string, err: unknown): void {
    this.opts.log.error({ event, err: err instanceof Error ? err.message : String(err) });
  }
}
