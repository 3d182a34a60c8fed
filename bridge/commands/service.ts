/**
 * The bridge's side of commands (docs/decisions.md §6): `POST /0/devices/<id>/` stores a command and hands it to the
 * device when the device is connected; each hello hands over again every command the device has not finished
 * and that has not expired (the agent keeps commands by uuid, so a repeat is answered, not run again); status
 * reports on `up/cmd` move a command forward; a command the device never received expires on the bridge.
 */
import type { Logger } from '../../lib/log.js';
import { type CmdStatusMessage, messageId } from '../../protocol/index.js';
import type { SendDown } from '../devices/link.js';
import type { EventBus } from '../events/bus.js';
import type { BridgeStore, StoreTx } from '../store/types.js';
import type { NewBridgeCommand, StoredCommand } from './store.js';

export interface CommandServiceOptions {
  store: BridgeStore;
  log: Logger;
  now: () => number;
  /** Decision 13: open commands per device. */
  maxOpen: number;
  /** Where committed changes of commands are announced (`command.changed`): docs/scaling.md, "The event bus". */
  events?: EventBus;
}

export type SubmitOutcome = { ok: true; id: string } | { ok: false; reason: 'full' };

export class CommandService {
  private send: SendDown = () => false;
  private linkUp: () => boolean = () => false;
  /** Submits waiting for the end of this turn of the event loop (see turnEnd). */
  private waiting: Array<() => void> = [];
  readonly counters = { submitted: 0, sent: 0, reports: 0, stale: 0, expired: 0 };

  constructor(private readonly o: CommandServiceOptions) {}

  /** Connects the service to the MQTT side: how to send, and whether the link is up now. */
  attach(send: SendDown, linkUp: () => boolean): void {
    this.send = send;
    this.linkUp = linkUp;
  }

  /** Stores a command (durably) and hands it over when the device is connected. */
  async submit(
    deviceId: string,
    userId: number | null,
    command: Buffer,
    priority: 0 | 1 | 2,
    lifetimeMs: number,
  ): Promise<SubmitOutcome> {
    const { store, now } = this.o;
    const id = crypto.randomUUID();
    const t = now();
    await this.turnEnd();
    const c: NewBridgeCommand = { id, deviceId, userId, command, priority, createdAt: t, expiresAt: t + lifetimeMs };
    // To a connected device it goes right after the commit, so it is recorded `sent` in the same transaction; if the
    // hand-over fails after all, the command is open and goes again at the next hello like any other.
    const handOver = this.linkUp() && (await this.connected(deviceId));
    const added = await store.write(async (tx) => {
      if ((await tx.commands.openCount(deviceId)) >= this.o.maxOpen) return false;
      await tx.commands.add(c, handOver ? t : undefined);
      return true;
    });
    if (!added) return { ok: false, reason: 'full' };
    this.o.events?.publish({ type: 'command.changed', deviceId, id, state: handOver ? 'sent' : 'queued' });
    this.counters.submitted++;
    this.o.log.info({ event: 'cmd.submitted', deviceId, cmd: id, priority, lifetimeMs });
    if (handOver && this.publish(c)) this.counters.sent++;
    return { ok: true, id };
  }

  /** On hello: every open command that has not expired goes again, oldest first. */
  async onHello(deviceId: string): Promise<void> {
    const { store, now } = this.o;
    let after = 0;
    let sent = 0;
    for (;;) {
      const page = await store.commands.open(deviceId, after, 200);
      const t = now();
      const live = page.filter((c) => c.expiresAt > t);
      sent += this.handOver(live);
      if (page.length < 200) break;
      after = page[page.length - 1]!.seq;
    }
    if (sent > 0) this.o.log.info({ event: 'cmd.resent', deviceId, count: sent });
  }

  /** A status report: applied if it moves the command forward; a stale or foreign one changes nothing. */
  async onStatus(
    deviceId: string,
    msg: CmdStatusMessage,
    alsoInTransaction?: (tx: StoreTx) => Promise<void>,
  ): Promise<void> {
    this.counters.reports++;
    const moved = await this.o.store.write(
      async (tx) => {
        await alsoInTransaction?.(tx);
        return tx.commands.report(deviceId, msg);
      },
      { durable: false },
    );
    if (moved) {
      // A `queued` report says the device has it: the command is `sent` (commands/store.ts).
      const state = msg.state === 'queued' ? 'sent' : msg.state;
      this.o.events?.publish({ type: 'command.changed', deviceId, id: msg.cmd, state });
    }
    if (!moved) this.counters.stale++;
    else if (msg.state !== 'queued' && msg.state !== 'running') {
      this.o.log.info({ event: 'cmd.finished', deviceId, cmd: msg.cmd, state: msg.state, exitCode: msg.exitCode });
    }
  }

  /** Hourly: finished commands older than `keepDays`, in batches. Returns how many went. */
  async prune(keepDays: number): Promise<number> {
    const before = this.o.now() - keepDays * 86_400_000;
    let total = 0;
    for (;;) {
      const n = await this.o.store.write((tx) => tx.commands.prune(before, 5000), { durable: false });
      total += n;
      if (n < 5000) return total;
    }
  }

  /** Commands never received whose lifetime ended become `expired`; run every second. */
  async sweep(): Promise<number> {
    const n = await this.o.store.write((tx) => tx.commands.expire(this.o.now()), { durable: false });
    this.counters.expired += n;
    return n;
  }

  /**
   * Resolves every caller of this turn of the event loop at once, after the I/O of the turn: the commands that
   * requests on several connections bring in the same turn then share one transaction and one fsync (the group
   * commit batches what is written in one run of microtasks, and each request is parsed in a callback of its own).
   */
  private turnEnd(): Promise<void> {
    return new Promise((resolve) => {
      this.waiting.push(resolve);
      if (this.waiting.length > 1) return;
      setImmediate(() => {
        const waiting = this.waiting;
        this.waiting = [];
        for (const w of waiting) w();
      });
    });
  }

  private async connected(deviceId: string): Promise<boolean> {
    return (await this.o.store.devices.getVar(deviceId, 'meta', 'state'))?.value?.toString('utf8') === 'connected';
  }

  private publish(c: NewBridgeCommand | StoredCommand): boolean {
    return this.send(c.deviceId, 'down/cmd', {
      id: messageId(),
      cmd: c.id,
      command64: c.command.toString('base64'),
      priority: c.priority,
      created: c.createdAt,
      expires: c.expiresAt,
    });
  }

  /** Publishes commands and records them `sent`; returns how many went. */
  private handOver(commands: readonly StoredCommand[]): number {
    const sent: string[] = [];
    for (const c of commands) {
      if (!this.publish(c)) break;
      sent.push(c.id);
    }
    if (sent.length === 0) return 0;
    this.counters.sent += sent.length;
    const t = this.o.now();
    void this.o.store
      .write(
        async (tx) => {
          for (const id of sent) await tx.commands.markSent(id, t);
        },
        { durable: false },
      )
      .then(() => {
        // `markSent` moves only a `queued` command; one a report moved further stays where it is.
        for (const c of commands.slice(0, sent.length)) {
          if (c.state === 'queued')
            this.o.events?.publish({ type: 'command.changed', deviceId: c.deviceId, id: c.id, state: 'sent' });
        }
      })
      .catch((err: unknown) => this.o.log.warn({ event: 'cmd.mark_sent_failed', err: String(err) }));
    return sent.length;
  }
}
