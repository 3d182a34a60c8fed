/**
 * The cloud side of variable synchronisation (docs/decisions.md §3 and §4) and of presence and nearby (§5):
 * what the bridge does with each message a device publishes, and with each change a user makes through the API.
 *
 * The rules are the agent's, seen from the cloud (docs/sync.md): a version is applied when it is newer; every
 * item is acknowledged after its commit, a duplicate again; a cloud version stays pending (`acked < time`) until
 * the device acknowledges it, and is pushed again on every hello until then, and while the device stays connected
 * on the resend schedule (resend.ts, docs/protocol.md); a sync has its own stamps.
 */
import type { Logger } from '../../lib/log.js';
import {
  type AckItem,
  type FwState,
  type HelloMessage,
  type StatePayload,
  type VarItem,
  type VarsMessage,
  type VersionRecord,
  CLOCK_TOLERANCE_MS,
  MAX_BATCH_ITEMS,
  ackFor,
  chunkVarItems,
  decodeValue,
  isFwFinalState,
  messageId,
  varItem,
} from '../../protocol/index.js';
import type { CommandService } from '../commands/service.js';
import { type BusEvent, type EventBus, type VarChange, withValues } from '../events/bus.js';
import type { BridgeStore, StoreTx } from '../store/types.js';
import { userOfAuthcode } from '../users/authcode.js';
import type { SendDown, UpMessage } from './link.js';
import { ResendSchedule } from './resend.js';
import { HistoryRetention } from './retention.js';
import type { VarRecord } from './store.js';

export interface DeviceServiceOptions {
  store: BridgeStore;
  log: Logger;
  now: () => number;
  /** Decision 18. */
  nearbyWindowMs: number;
  /** `meta` `lastactivity` is written at most this often per device. */
  lastActivityMs: number;
  /** Commands: handed over again on hello, and their status reports. */
  commands?: CommandService;
  /** Firmware: an open job is sent again on hello (firmware/resend.ts). */
  firmware?: { onHello(deviceId: string): Promise<void> };
  /** The resend of what a connected device has not acknowledged: first and longest wait, ms (resend.ts). */
  resend?: { firstMs: number; maxMs: number };
  /** History retention: the age in days and the entries per variable kept, 0 for no limit (retention.ts). */
  retention?: { maxAgeDays: number; maxPerVariable: number };
  /**
   * Where committed changes of devices are announced (`device.vars`, `device.state`, `device.registration`):
   * docs/scaling.md, "The event bus".
   */
  events?: EventBus;
}

/** `state` payloads as `meta` `state` values (decision 21). */
const META_STATE: Record<StatePayload, 'connected' | 'disconnected' | 'sleeping'> = {
  online: 'connected',
  offline: 'disconnected',
  sleeping: 'sleeping',
};

/** Rows read per page of a catch-up, and items per `down/` message. */
const PAGE = 500;

export interface DeviceCounters {
  /** Messages handled, by topic. */
  handled: number;
  /** Hellos whose device id differs from the topic's. */
  helloMismatch: number;
  /** Hellos whose auth code another device already has. */
  authcodeTaken: number;
  /** Authcodes heard that match no user. */
  heardUnknown: number;
  /** Authcodes heard by a device claimed by someone else than the user they belong to: dropped. */
  heardForeign: number;
  /** Handling failed (a database error): logged, and the device's re-send will bring it again. */
  failed: number;
}

export class DeviceService {
  private send: SendDown = () => false;
  /**
   * Devices whose row is committed: a unit of work for one of them need not insert it (a device's row is never
   * removed). Added once the unit that inserted (or found) it has committed, not while it runs: on PostgreSQL the
   * messages of one device are handled in transactions of their own at the same time, and one that took the row as
   * known before the other had committed it inserted variables of a device it could not see (a foreign key
   * violation, and a hello lost with it). SQLite, whose units run one after another, never showed it.
   */
  private readonly known = new Set<string>();
  /** When each device's `lastactivity` was last written: at most every `lastActivityMs`. */
  private readonly activityWritten = new Map<string, number>();
  /**
   * Per device whose latest hello says `clock`, its own clock minus the bridge's at that hello (`ts` is the gateway's
   * uncorrected clock): what an unverified version is corrected by (decision 24, docs/sync.md#clocks). A device
   * without an entry is not re-stamped unless it marks a version unverified: an older agent would not take the
   * bridge's answer, and the two sides would differ.
   */
  private readonly skews = new Map<string, number>();
  readonly counters: DeviceCounters = {
    handled: 0,
    helloMismatch: 0,
    authcodeTaken: 0,
    heardUnknown: 0,
    heardForeign: 0,
    failed: 0,
  };
  /** When each connected device with something unacknowledged gets it again (docs/sync.md). */
  readonly resend: ResendSchedule;
  /** Removes history past its age or count limit, in the background (`retention.start()`). */
  readonly retention: HistoryRetention;

  constructor(private readonly opts: DeviceServiceOptions) {
    const firstMs = opts.resend?.firstMs ?? 5000;
    this.resend = new ResendSchedule({
      now: opts.now,
      firstMs,
      maxMs: opts.resend?.maxMs ?? 300_000,
      connected: async (deviceId) =>
        (await opts.store.devices.getVar(deviceId, 'meta', 'state'))?.value?.toString() === 'connected',
      resend: (deviceId) => this.resendPending(deviceId, firstMs),
      log: opts.log,
    });
    this.retention = new HistoryRetention({
      store: opts.store,
      now: opts.now,
      log: opts.log,
      maxAgeDays: opts.retention?.maxAgeDays ?? 0,
      maxPerVariable: opts.retention?.maxPerVariable ?? 0,
    });
  }

  /** Stops the resend timer and the retention (at shutdown). */
  async close(): Promise<void> {
    this.resend.stop();
    await this.retention.stop();
  }

  get store(): BridgeStore {
    return this.opts.store;
  }

  /** Connects the service to the MQTT side. */
  attach(send: SendDown): void {
    this.send = send;
  }

  /** Publishes to a device (firmware jobs); `false` when the link is down. */
  sendDown: SendDown = (deviceId, name, payload) => this.send(deviceId, name, payload);

  private readonly registrationListeners = new Set<(deviceId: string, owned: boolean) => void>();

  /** Called after a claim (`true`) or an unregister (`false`); returns the unsubscribe function. */
  onRegistration(fn: (deviceId: string, owned: boolean) => void): () => void {
    this.registrationListeners.add(fn);
    return () => this.registrationListeners.delete(fn);
  }

  /**
   * The routes report claims and unregisters here, once committed (the broker's device clients follow them:
   * bridge/mqtt/); `userId` is the new owner, or the former one.
   */
  registrationChanged(deviceId: string, owned: boolean, userId: number): void {
    this.publish({ type: 'device.registration', deviceId, owned, userId });
    for (const fn of this.registrationListeners) fn(deviceId, owned);
  }

  /** Announces a committed change on the event bus. */
  private publish(event: BusEvent): void {
    this.opts.events?.publish(event);
  }

  /**
   * Announces changed variables of a device, if any, with the values committed (keys `type:name`) for this bridge's
   * subscribers (`withValues`, bridge/events/bus.ts).
   */
  private varsChanged(deviceId: string, vars: VarChange[], values?: ReadonlyMap<string, Buffer | null>): void {
    if (vars.length === 0) return;
    const event: BusEvent = { type: 'device.vars', deviceId, vars };
    this.publish(values ? withValues(event, values) : event);
  }

  // ---- messages from devices ----

  /** PostgreSQL: per device, the handling of its latest message; the next one starts when it ends. */
  private readonly inOrder = new Map<string, Promise<void>>();

  /**
   * Handles one validated message; never throws (a failure is logged and counted).
   *
   * A device's messages are handled in the order they came. SQLite runs the units of work one after another in the
   * order they were asked for, so that holds by itself. On PostgreSQL each unit is a transaction of its own, run at
   * the same time as the others: two messages of one device could commit in the other order (a later `fwstate`
   * overwritten by an earlier one), and two that write the same variables in another order deadlocked (seen with a
   * hello and a meta report, and two meta reports). So there the next message of a device waits for the last.
   */
  handle(msg: UpMessage): Promise<void> {
    if (this.opts.store.engine === 'sqlite') return this.handleNow(msg);
    const id = msg.deviceId;
    const run = (this.inOrder.get(id) ?? Promise.resolve()).then(() => this.handleNow(msg));
    this.inOrder.set(id, run);
    void run.then(() => {
      if (this.inOrder.get(id) === run) this.inOrder.delete(id);
    });
    return run;
  }

  private handleNow(msg: UpMessage): Promise<void> {
    this.counters.handled++;
    let work: Promise<void>;
    switch (msg.name) {
      case 'state':
        work = this.onState(msg.deviceId, msg.payload);
        break;
      case 'up/hello':
        work = this.onHello(msg.deviceId, msg.payload);
        break;
      case 'up/vars':
        work = this.onVars(msg.deviceId, msg.payload);
        break;
      case 'up/acks':
        work = this.onAcks(msg.deviceId, msg.payload.acks);
        break;
      case 'up/meta':
        work = this.onMeta(msg.deviceId, msg.payload.meta);
        break;
      case 'up/heard':
        work = this.onHeard(msg.deviceId, msg.payload.heard);
        break;
      case 'up/cmd': {
        const commands = this.opts.commands;
        const now = this.opts.now();
        // One unit of work for the activity and the report: a busy device sends many.
        work = commands
          ? commands
              .onStatus(msg.deviceId, msg.payload, (tx) => this.activity(tx, msg.deviceId, now))
              .then(() => void this.known.add(msg.deviceId))
          : this.touch(msg.deviceId);
        break;
      }
    }
    return work.catch((err: unknown) => {
      this.counters.failed++;
      this.opts.log.error({
        event: 'device.message_failed',
        deviceId: msg.deviceId,
        topic: msg.name,
        err: String(err),
      });
    });
  }

  /** Records that a device was heard from; `lastactivity` is written at most every `lastActivityMs`. */
  private async activity(tx: StoreTx, deviceId: string, now: number): Promise<void> {
    const devices = tx.devices;
    if (!this.known.has(deviceId)) await devices.touch(deviceId, now);
    const last = this.activityWritten.get(deviceId) ?? -Infinity;
    if (now - last < this.opts.lastActivityMs) return;
    this.activityWritten.set(deviceId, now);
    await devices.setMeta(deviceId, 'lastactivity', String(now), now, 'server', false);
  }

  private touch(deviceId: string): Promise<void> {
    const now = this.opts.now();
    return this.deviceWrite(deviceId, (tx) => this.activity(tx, deviceId, now), { durable: false });
  }

  /** A unit of work for a device that records its activity: once committed, the device's row is {@link known}. */
  private async deviceWrite<T>(
    deviceId: string,
    work: (tx: StoreTx) => Promise<T>,
    options?: { durable?: boolean },
  ): Promise<T> {
    const value = await this.opts.store.write(work, options);
    this.known.add(deviceId);
    return value;
  }

  private async onState(deviceId: string, state: StatePayload): Promise<void> {
    const now = this.opts.now();
    await this.deviceWrite(
      deviceId,
      async (tx) => {
        await tx.devices.touch(deviceId, now);
        await tx.devices.setMeta(deviceId, 'state', META_STATE[state], now, 'server');
        if (state === 'online') await this.activity(tx, deviceId, now);
      },
      { durable: false },
    );
    this.publish({ type: 'device.state', deviceId, state: META_STATE[state] });
    // A device that is gone gets what it has not acknowledged at its next hello.
    if (state !== 'online') this.resend.forget(deviceId);
    this.opts.log.info({ event: 'device.state', deviceId, state: META_STATE[state] });
  }

  private async onHello(deviceId: string, hello: HelloMessage): Promise<void> {
    const log = this.opts.log;
    if (hello.deviceId !== deviceId) {
      this.counters.helloMismatch++;
      log.warn({ event: 'mqtt.drop', deviceId, topic: 'up/hello', reason: 'hello names another device' });
      return;
    }
    const now = this.opts.now();
    if (hello.clock === true) this.skews.set(deviceId, hello.ts - now);
    else this.skews.delete(deviceId);
    const metas: VarChange[] = ['unique', 'platform', 'fwversion', 'agentversion'].map((name) => ({
      type: 'meta',
      name,
      change: 'version',
    }));
    const written = this.deviceWrite(deviceId, async (tx) => {
      const devices = tx.devices;
      await this.activity(tx, deviceId, now);
      const ok = await devices.setAuthcode(deviceId, hello.authcode);
      await devices.setMeta(deviceId, 'unique', deviceId, now, 'device');
      await devices.setMeta(deviceId, 'platform', hello.platform, now, 'device');
      await devices.setMeta(deviceId, 'fwversion', hello.fwVersion, now, 'device');
      await devices.setMeta(deviceId, 'agentversion', hello.agentVersion, now, 'device');
      await devices.setMeta(deviceId, 'state', 'connected', now, 'server');
      // Decision 22: the firmware entries exist from the first hello; the device reports them during an update.
      for (const [name, value] of FW_META_DEFAULTS) {
        if (!(await devices.getVar(deviceId, 'meta', name))) {
          await devices.setMeta(deviceId, name, value, now, 'server');
          metas.push({ type: 'meta', name, change: 'version' });
        }
      }
      return !ok;
    });
    let failed: { err: unknown } | undefined;
    try {
      const taken = await written;
      this.publish({ type: 'device.state', deviceId, state: 'connected' });
      this.varsChanged(deviceId, metas);
      if (taken) {
        this.counters.authcodeTaken++;
        log.warn({ event: 'device.authcode_taken', deviceId, reason: 'another device has this auth code' });
      }
    } catch (err) {
      failed = { err };
    }
    log.info({ event: 'device.hello', deviceId, platform: hello.platform, mode: hello.mode });
    // What waits for the device goes whether or not the hello's own bookkeeping was written: the catch-up only
    // reads and publishes, and this hello is the only one the device sends on this connection. Made to wait on
    // that write, a full disk (docs/operations.md, "A full disk") left every change committed while the device
    // was away unsent until the device reconnected, however long it stayed connected after space was freed.
    // The answer to the hello is the bridge's clock, so that an agent learns it even when nothing else is due.
    if (hello.clock === true) this.send(deviceId, 'down/vars', { id: messageId(), items: [], now: this.opts.now() });
    await this.catchUp(deviceId);
    this.resend.reset(deviceId);
    await this.opts.commands?.onHello(deviceId);
    await this.opts.firmware?.onHello(deviceId);
    // Logged and counted as any message that could not be stored (`device.message_failed`).
    if (failed) throw failed.err;
  }

  /**
   * The bridge's own connection to the broker is up (again): what was changed through the API while it was down
   * goes to the devices that are connected now, without waiting for their next hello.
   */
  async onLinkUp(): Promise<void> {
    const ids = await this.opts.store.devices.connectedIds();
    for (const id of ids) {
      await this.catchUp(id);
      await this.opts.commands?.onHello(id);
    }
    if (ids.length > 0) this.opts.log.info({ event: 'devices.caught_up', devices: ids.length });
  }

  /** Sends again every cloud version and every sync the device has not acknowledged, a page at a time. */
  async catchUp(deviceId: string): Promise<number> {
    const devices = this.opts.store.devices;
    let after = '';
    let sent = 0;
    for (;;) {
      const page = await devices.pending(deviceId, after, PAGE);
      if (page.length === 0) break;
      const items = pendingItems(page);
      if (!this.sendVars(deviceId, items)) return sent;
      sent += items.length;
      after = page[page.length - 1]!.name;
      if (page.length < PAGE) break;
    }
    if (sent > 0) this.opts.log.info({ event: 'vars.catch_up', deviceId, items: sent });
    return sent;
  }

  /**
   * The resend schedule's turn for a connected device: what the catch-up would send, but for what went out within
   * the last `minAgeMs` (by its `time` or `synced` stamp, the bridge's clock), a page at a time, yielding between
   * pages so that requests keep being served. `undefined` when the link could not take it.
   */
  private async resendPending(
    deviceId: string,
    minAgeMs: number,
  ): Promise<{ sent: number; young: number } | undefined> {
    const devices = this.opts.store.devices;
    const now = this.opts.now();
    // A stamp in this window was set moments ago; one far ahead of the bridge's clock does not say so.
    const young = (stamp: number) => stamp > now - minAgeMs && stamp <= now + minAgeMs;
    let after = '';
    const r = { sent: 0, young: 0 };
    for (;;) {
      const page = await devices.pending(deviceId, after, PAGE);
      if (page.length === 0) break;
      const items: VarItem[] = [];
      for (const rec of page) {
        for (const item of pendingItems([rec])) {
          if (young(item.kind === 'push' ? rec.time : rec.synced)) r.young++;
          else items.push(item);
        }
      }
      if (items.length > 0 && !this.sendVars(deviceId, items)) return undefined;
      r.sent += items.length;
      if (page.length < PAGE) break;
      after = page[page.length - 1]!.name;
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    return r;
  }

  private async onVars(deviceId: string, msg: VarsMessage): Promise<void> {
    const now = this.opts.now();
    const repush: VarItem[] = [];
    const skew = this.skews.get(deviceId);
    let restamped = 0;
    const changed: VarChange[] = [];
    const values = new Map<string, Buffer | null>();
    const acks = await this.deviceWrite(deviceId, async (tx) => {
      const devices = tx.devices;
      await this.activity(tx, deviceId, now);
      const out: AckItem[] = [];
      for (const item of msg.items) {
        // A cloud version the device has not acknowledged yet, read only for a version far ahead (rule 2 of
        // docs/sync.md#clocks): the device's change was made without knowing it.
        const held =
          item.time > now + CLOCK_TOLERANCE_MS ? await devices.getVar(deviceId, item.type, item.name) : undefined;
        const unseen = held && held.origin === 'cloud' && held.acked < held.time ? held.time : undefined;
        const time = item.unverified === true || skew !== undefined ? cloudTime(item, skew, now, unseen) : item.time;
        const r = await devices.applyFromDevice(
          deviceId,
          { type: item.type, name: item.name, value: decodeValue(item), time, origin: item.origin },
          now,
        );
        if (r.outcome === 'applied') {
          changed.push({ type: item.type, name: item.name, change: 'version' });
          values.set(`${item.type}:${item.name}`, decodeValue(item));
        }
        if ((time !== item.time || item.unverified === true) && item.type === 'd') {
          // Re-stamped (an unverified version always is): the device holds a version the cloud does not keep.
          // Whichever version won here goes to the device instead of an acknowledgement, and the agent takes it over
          // its own (docs/sync.md#clocks); until the device acknowledges it, it is pending like any cloud change, and
          // a repeat of the item gets it again.
          restamped++;
          if (r.outcome === 'applied') await devices.unack(deviceId, item.type, item.name);
          repush.push({
            ...varItem(asVersion((await devices.getVar(deviceId, item.type, item.name))!), 'push'),
            replaces: item.time,
          });
          continue;
        }
        // A device's sync says "this is what I hold": older than ours means it lost ours, which goes again.
        if (r.outcome === 'older' && item.kind === 'sync' && item.type === 'd') {
          await devices.unack(deviceId, item.type, item.name);
          repush.push(varItem(asVersion(r.held), 'push'));
        }
        out.push(ackFor(item));
      }
      return out;
    });
    this.varsChanged(deviceId, changed, values);
    if (restamped > 0) {
      this.opts.log.info({ event: 'vars.restamped', deviceId, items: restamped, skewMs: skew ?? null });
    }
    for (let i = 0; i < acks.length; i += MAX_BATCH_ITEMS) {
      this.send(deviceId, 'down/acks', { id: messageId(), acks: acks.slice(i, i + MAX_BATCH_ITEMS) });
    }
    if (repush.length > 0) this.sendVars(deviceId, repush);
  }

  private async onAcks(deviceId: string, acks: readonly AckItem[]): Promise<void> {
    const now = this.opts.now();
    // An acknowledgement stamp promises nothing to anyone: lost, it costs one more push of the same version.
    const changed = await this.deviceWrite(
      deviceId,
      async (tx) => {
        const devices = tx.devices;
        await this.activity(tx, deviceId, now);
        const out: VarChange[] = [];
        for (const a of acks) {
          const moved =
            a.kind === 'push'
              ? await devices.ackVersion(deviceId, a.type, a.name, a, now)
              : a.synced !== undefined && (await devices.ackSync(deviceId, a.type, a.name, a.synced, now));
          if (moved) out.push({ type: a.type, name: a.name, change: 'ack' });
        }
        return out;
      },
      { durable: false },
    );
    this.varsChanged(deviceId, changed);
    // The device is taking what it is sent: what is left goes again soon.
    this.resend.reset(deviceId);
  }

  private async onMeta(deviceId: string, meta: Record<string, string>): Promise<void> {
    const now = this.opts.now();
    const changed: VarChange[] = [];
    const values = new Map<string, Buffer | null>();
    const written = (name: string, value: string) => {
      changed.push({ type: 'meta', name, change: 'version' });
      values.set(`meta:${name}`, Buffer.from(value, 'utf8'));
    };
    await this.deviceWrite(deviceId, async (tx) => {
      const devices = tx.devices;
      await this.activity(tx, deviceId, now);
      // The presence and identity entries are the bridge's own; a device cannot overwrite them.
      for (const [name, value] of Object.entries(meta)) {
        if (RESERVED_META.has(name)) continue;
        await devices.setMeta(deviceId, name, value, now, 'device', !UNRECORDED_META.has(name));
        written(name, value);
      }
      // An agent that predates failure codes reports `fwerror` alone: a code left from an earlier report would
      // name another failure, so the code is emptied (docs/firmware.md, "Failure codes").
      if (meta.fwerror !== undefined && meta.fwerrorcode === undefined) {
        await devices.setMeta(deviceId, 'fwerrorcode', '', now, 'device');
        written('fwerrorcode', '');
      }
      // A final firmware state ends the device's open job (docs/decisions.md §7).
      const fwstate = meta.fwstate;
      if (fwstate !== undefined && isFwFinalState(fwstate)) {
        const job = await tx.fwJobs.openOf(deviceId);
        if (job) await tx.fwJobs.end(job.id, fwstate, now);
      }
    });
    this.varsChanged(deviceId, changed, values);
  }

  /**
   * Authcodes heard on UDP 590: the device claims that the user is near (docs/api.md, "Nearby: what a device
   * claims"). Only a current authcode counts (decision 17). A device claimed by a user reports only that user:
   * what it says it heard of anyone else is dropped, so that an owned device cannot put itself before strangers,
   * nor keep a record of who passed by. The bridge stamps reports with its own clock: the agent reports only what
   * it heard within its freshness window, and the gateway's clock may be off.
   */
  private async onHeard(deviceId: string, heard: ReadonlyArray<{ authcode: string }>): Promise<void> {
    const now = this.opts.now();
    let unknown = 0;
    let foreign = 0;
    await this.deviceWrite(
      deviceId,
      async (tx) => {
        const devices = tx.devices;
        await this.activity(tx, deviceId, now);
        const owner = (await devices.device(deviceId))?.ownerId ?? null;
        for (const h of heard) {
          const user = await userOfAuthcode(tx, h.authcode, now);
          if (!user) unknown++;
          else if (owner !== null && owner !== user.id) foreign++;
          else await devices.heard(deviceId, user.id, now);
        }
      },
      { durable: false },
    );
    if (unknown > 0) {
      this.counters.heardUnknown += unknown;
      this.opts.log.debug({ event: 'nearby.unknown_authcode', deviceId, count: unknown });
    }
    if (foreign > 0) {
      this.counters.heardForeign += foreign;
      this.opts.log.debug({ event: 'nearby.foreign_heard', deviceId, count: foreign });
    }
  }

  // ---- changes made through the API ----

  /**
   * Sets (or, with `null`, deletes) a variable as a user. A `d` version is pushed to the device after its
   * commit; it stays pending until acknowledged. Resolves to `false` when there is nothing to delete.
   */
  async setVar(deviceId: string, type: 'd' | 's', name: string, value: Buffer | null): Promise<boolean> {
    return (await this.setVarAt(deviceId, type, name, value)) === 'set';
  }

  /**
   * `setVar` with the time the caller stamped the version with (`timestamp`, docs/api.md), already checked against
   * the tolerance. Last writer wins (docs/sync.md): a stamp at or before the held version's time would lose to it
   * at once, on the bridge and on the device, so the version is not written and the answer is `older`
   * (decision 26), never an ok for a change that does not take. Without a stamp: now, or just after the held
   * version. `none`: nothing to delete.
   */
  async setVarAt(
    deviceId: string,
    type: 'd' | 's',
    name: string,
    value: Buffer | null,
    stamp?: number,
  ): Promise<'set' | 'none' | 'older'> {
    const now = this.opts.now();
    const rec = await this.opts.store.write(async (tx) => {
      const devices = tx.devices;
      const cur = await devices.getVar(deviceId, type, name, { forUpdate: true });
      if (value === null && (!cur || cur.value === null)) return 'none' as const;
      if (stamp !== undefined && cur && stamp <= cur.time) return 'older' as const;
      const time = stamp ?? (cur ? Math.max(now, cur.time + 1) : now);
      const v = { type, name, value, time, origin: 'cloud' as const };
      // An `s` version is never pushed: it is acknowledged by being on the server.
      await devices.putVersion(deviceId, v, type === 'd' ? 0 : time, 'user');
      return (await devices.getVar(deviceId, type, name))!;
    });
    if (rec === 'none' || rec === 'older') return rec;
    this.varsChanged(deviceId, [{ type, name, change: 'version' }], new Map([[`${type}:${name}`, rec.value]]));
    if (type === 'd') this.sendVars(deviceId, [varItem(asVersion(rec), 'push')]);
    return 'set';
  }

  /** Rule 3: re-sends the current version of a `d` variable; `false` when there is none. */
  async syncVar(deviceId: string, name: string): Promise<boolean> {
    const now = this.opts.now();
    const rec = await this.opts.store.write(async (tx) => {
      const devices = tx.devices;
      const cur = await devices.getVar(deviceId, 'd', name, { forUpdate: true });
      if (!cur || cur.value === null) return undefined;
      await devices.markSynced(deviceId, 'd', name, now);
      return (await devices.getVar(deviceId, 'd', name))!;
    });
    if (!rec) return false;
    this.varsChanged(deviceId, [{ type: 'd', name, change: 'sync' }]);
    this.sendVars(deviceId, [varItem(asVersion(rec), 'sync')]);
    return true;
  }

  /** Sends pushes and syncs; each waits for the device's acknowledgement, and is sent again until it comes. */
  private sendVars(deviceId: string, items: VarItem[]): boolean {
    // At most a page of items, and well under the agent's payload limit (and the broker's packet limit, which
    // would cut the bridge's own connection): values of up to 64 KiB make 500 of them too large for one message.
    for (const chunk of chunkVarItems(items, PAGE, (item) => item)) {
      if (!this.send(deviceId, 'down/vars', { id: messageId(), items: chunk })) return false;
    }
    if (items.length > 0) this.resend.sent(deviceId);
    return true;
  }

  // ---- upkeep ----

  /** Hourly: nearby entries past the window. History has its own retention (`retention`). */
  async prune(): Promise<{ nearby: number }> {
    const { store } = this.opts;
    const nearby = await store.write((tx) => tx.devices.pruneNearby(this.opts.now() - this.opts.nearbyWindowMs), {
      durable: false,
    });
    return { nearby };
  }
}

/** Decision 22: the firmware meta variables of a device that has not updated its firmware yet. */
const FW_META_DEFAULTS: ReadonlyArray<readonly [string, string]> = [
  ['fwstate', 'idle' satisfies FwState],
  ['fwprogress', '0'],
  ['fwname', ''],
  ['fwerror', ''],
  ['fwerrorcode', ''],
];

/**
 * The `meta` entries the bridge keeps itself (decision 22). `fwversion` is not among them: the agent reports the
 * version it committed after a firmware update in `up/meta`, without reconnecting.
 */
const RESERVED_META: ReadonlySet<string> = new Set(['state', 'lastactivity', 'unique', 'platform', 'agentversion']);

/**
 * The agent's periodic report (agent/report.ts): the current value is kept, without history entries, which
 * would otherwise grow by one per variable and device at every report.
 */
const UNRECORDED_META: ReadonlySet<string> = new Set(['uptime', 'pending', 'queue', 'rss']);

/**
 * The time the cloud orders a device's version by (decision 24, docs/sync.md#clocks). A version the agent stamped
 * before it knew the cloud's clock (`unverified`) is moved by the device's skew at its latest hello, and never
 * later than now. Any other device version more than CLOCK_TOLERANCE_MS ahead of the bridge's clock was made at an
 * unknown time before now: it is taken as made now, unless the bridge holds a cloud version the device has not
 * acknowledged (`unseen`, its time), which the device's change cannot have followed: then it takes that version's
 * time, and the cloud's version wins the tie. Everything else keeps its time.
 */
export function cloudTime(item: VarItem, skew: number | undefined, now: number, unseen?: number): number {
  if (item.origin !== 'device') return item.time;
  if (item.unverified === true) return Math.max(0, Math.min(now, item.time - (skew ?? 0)));
  if (item.time <= now + CLOCK_TOLERANCE_MS) return item.time;
  return unseen === undefined ? now : Math.min(now, unseen);
}

/** What a page of unacknowledged records sends: the version of each pending push, and each pending sync. */
function pendingItems(page: readonly VarRecord[]): VarItem[] {
  const items: VarItem[] = [];
  for (const rec of page) {
    if (rec.acked < rec.time) items.push(varItem(asVersion(rec), 'push'));
    if (rec.syncacked < rec.synced) items.push(varItem(asVersion(rec), 'sync'));
  }
  return items;
}

/** A stored `d` record as the wire sees it. */
function asVersion(rec: VarRecord): VersionRecord {
  return { ...rec, type: rec.type === 's' ? 's' : 'd' };
}
