/**
 * The live channel's hub (docs/api.md, "Live channel"; decision 31): every open channel of this bridge, WebSocket
 * (`ws.ts`) or Server-Sent Events (`sse.ts`), fed from the event bus (bridge/events/bus.ts), so that a change
 * committed by any bridge on the database reaches a channel held by this one.
 *
 * - Who sees what: per user, the devices `deviceIdsOf(user)` lists, kept in memory while the user has a channel
 *   (and, for an SSE resume, `live.sseResumeMs` after), and moved by `device.registration` and `device.shared`.
 * - Events name what changed; a channel keeps only the set of (device, type, name) keys waiting to be sent, and its
 *   next frame reads those records from the store. A change that reaches a channel twice, or twice before it is
 *   sent, is sent once; a variable's versions go out in the order they were committed, since each frame reads the
 *   store after the last frame's reads, and frames of one channel are built one after another.
 * - WebSocket frames are coalesced per channel, at most one delta per `throttletime`. SSE frames are built once per
 *   user and kept in a bounded log with their ids, which every SSE stream of that user reads: that log is what a
 *   `Last-Event-ID` resume replays.
 * - A channel whose socket holds more than `live.highWaterBytes` is sent nothing more until it drains; its keys
 *   keep coalescing. It is closed (4008) once it has stalled for `live.maxLagMs` or holds more than
 *   `live.maxPendingKeys` keys (an SSE stream: once it falls behind its user's log).
 * - One interval for the whole hub pings every channel; no timer per idle channel.
 * - A channel ends (4001) with its session, or, opened with a bearer access token, with that token: `session.ended`
 *   names the session's hash, the token's number, or neither (every channel of the user). Those it names are
 *   remembered a minute, so that a channel whose handshake was under way then is closed as it opens.
 */
import { randomBytes } from 'node:crypto';
import type { Logger } from '../../lib/log.js';
import type { BridgeConfig } from '../config.js';
import type { DeliveredEvent, EventBus } from '../events/bus.js';
import type { BridgeStore } from '../store/types.js';
import type { LiveIdentity } from './auth.js';
import { userEventFrame } from '../rules/view.js';
import { claimedFrame, deltaFrame, deltaRecord, devicesFrame, liveDeviceJson, removedFrame } from './frames.js';

export type ChannelKind = 'ws' | 'sse';
export type FrameKind = 'devices' | 'delta' | 'events';

/** Why a channel ended: the metric's label and the log's `reason`. */
export type CloseReason = 'client' | 'session' | 'slow' | 'ping' | 'shutdown' | 'error';

/** The close code and reason text the client gets, by why the bridge closed it (docs/api.md, "Close codes"). */
export const CLOSE_CODES: Record<Exclude<CloseReason, 'client'>, { code: number; text: string }> = {
  session: { code: 4001, text: 'session ended' },
  slow: { code: 4008, text: 'too far behind' },
  // Not sent: the peer did not answer a ping, so the connection is cut (the client sees 1006).
  ping: { code: 1006, text: 'no pong' },
  shutdown: { code: 1001, text: 'bridge shutting down' },
  error: { code: 1011, text: 'internal error' },
};

/** Where a channel's frames go. */
export interface Sink {
  /** Bytes written and not yet taken by the kernel. */
  buffered(): number;
  /** `id`: the SSE event id (WebSocket frames have none). */
  send(kind: FrameKind, json: string, id?: string): void;
  /** Keepalive; `false` when the peer has not answered the previous one. */
  ping(): boolean;
  /** Ends the channel; code 1006 cuts the connection without a closing handshake. */
  close(code: number, text: string): void;
  /** Calls `fn` once when the socket's buffer has drained. */
  onDrain(fn: () => void): void;
}

/** Pending keys: device id → `type:name`. */
type Pending = Map<string, Set<string>>;

/** What the hub keeps per user with a channel. */
interface UserEntry {
  id: number;
  devices: Set<string>;
  /** Devices being claimed or shared: their changes wait until the `device-claimed` frame is out. */
  adding: Set<string>;
  /** While the first list is being read: what events did meanwhile (true: added, false: removed). */
  loadEdits: Map<string, boolean> | null;
  loaded: Promise<void>;
  /** The first list could not be read: the next snapshot reads it again. */
  loadFailed: boolean;
  channels: Set<Channel>;
  /** The SSE log, from the user's first SSE stream. */
  sse: SseLog | null;
  /** With no channel left: when the entry goes (an SSE resume may come until then); 0 while it has channels. */
  lingerUntil: number;
}

interface SseFrame {
  n: number;
  kind: FrameKind;
  json: string;
}

interface SseLog {
  pending: Pending | null;
  frames: SseFrame[];
  /** Frames up to this number are not in the log (before it began, or dropped from its front). */
  floor: number;
  /**
   * The log's frames and its streams' snapshots are built one after another, so that a frame numbered after a
   * snapshot never holds a record read before it.
   */
  busy: Promise<void>;
}

export class Channel {
  pending: Pending | null = null;
  pendingCount = 0;
  /** Its snapshot is out: deltas may follow. */
  ready = false;
  throttleMs = 0;
  lastSentAt = 0;
  timer: NodeJS.Timeout | undefined = undefined;
  /** When its socket went over the high-water mark (0: it is not stalled). */
  stalledSince = 0;
  waitingDrain = false;
  /** SSE: the number of the last frame written. */
  lastN = 0;
  /** Counts the snapshots begun: only the latest one is sent. */
  snapshots = 0;
  /** WebSocket: `user-event` frames that came while its snapshot was being read, sent right after it. */
  heldEvents: string[] = [];
  closed = false;
  readonly openedAt = performance.now();

  constructor(
    readonly kind: ChannelKind,
    readonly user: UserEntry,
    /** The stored hash of the session it was opened with; none for a bearer token. */
    readonly idHash: string | undefined,
    /** The number of the access token it was opened with as a bearer token; none for a session. */
    readonly tokenId: number | undefined,
    readonly address: string,
    readonly sink: Sink,
  ) {}
}

export interface LiveFigures {
  open: Record<ChannelKind, number>;
  frames: Record<ChannelKind, Record<FrameKind, number>>;
  closed: Record<CloseReason, number>;
}

export interface HubDeps {
  store: BridgeStore;
  events: EventBus;
  config: BridgeConfig;
  log: Logger;
}

type VarType = 'd' | 's' | 'meta';

/**
 * How long, and how many, ended sessions and revoked tokens the hub remembers: a channel authenticated just before
 * its session ended or its token was revoked (the event came during its handshake) is closed as it opens. Session
 * hashes and token numbers are never given again, so remembering one wrongs no later channel.
 */
const ENDED_MEMORY_MS = 60_000;
const ENDED_MEMORY_MAX = 10_000;
const ALWAYS = ['meta:lastactivity', 'meta:state'];
/** `user-event` frames one WebSocket channel holds while its snapshot is read. */
const HELD_EVENTS_MAX = 100;

export class LiveHub {
  private readonly users = new Map<number, UserEntry>();
  private readonly deviceUsers = new Map<string, Set<UserEntry>>();
  private readonly channels = new Set<Channel>();
  private readonly perUser = new Map<number, number>();
  private readonly perAddress = new Map<string, number>();
  private readonly dirty = new Set<Channel>();
  private readonly dirtySse = new Set<UserEntry>();
  private running = false;
  private ticker: NodeJS.Timeout | undefined;
  private readonly unsubscribe: () => void;
  /** SSE event ids: `<n>.<tag>`, n counting up on this bridge, the tag telling this bridge's run from others. */
  private n = 0;
  readonly tag = randomBytes(4).toString('hex');
  private stopped = false;
  /** Sessions and access tokens ended lately, and when: see `rememberEnded`. */
  private readonly ended = new Map<string, number>();
  readonly figures: LiveFigures = {
    open: { ws: 0, sse: 0 },
    frames: { ws: { devices: 0, delta: 0, events: 0 }, sse: { devices: 0, delta: 0, events: 0 } },
    closed: { client: 0, session: 0, slow: 0, ping: 0, shutdown: 0, error: 0 },
  };

  constructor(private readonly d: HubDeps) {
    this.unsubscribe = d.events.subscribe((e) => this.onEvent(e));
  }

  private get cfg(): BridgeConfig['live'] {
    return this.d.config.live;
  }

  // ---- admission ----

  /** Counts a channel about to open against the limits; `undefined` when it may, else which limit it hits. */
  reserve(userId: number, address: string): 'user' | 'address' | undefined {
    if (this.stopped) return 'user';
    if ((this.perUser.get(userId) ?? 0) >= this.cfg.maxPerUser) return 'user';
    if ((this.perAddress.get(address) ?? 0) >= this.cfg.maxPerAddress) return 'address';
    this.perUser.set(userId, (this.perUser.get(userId) ?? 0) + 1);
    this.perAddress.set(address, (this.perAddress.get(address) ?? 0) + 1);
    return undefined;
  }

  /** Gives back what `reserve` took (a handshake that failed, a channel that closed). */
  release(userId: number, address: string): void {
    const u = (this.perUser.get(userId) ?? 1) - 1;
    if (u > 0) this.perUser.set(userId, u);
    else this.perUser.delete(userId);
    const a = (this.perAddress.get(address) ?? 1) - 1;
    if (a > 0) this.perAddress.set(address, a);
    else this.perAddress.delete(address);
  }

  // ---- channels ----

  /**
   * Opens a channel reserved with `reserve`: it is sent the snapshot of the user's devices, then their changes.
   * An SSE stream with `resumeAfter` (its `Last-Event-ID`) is sent the frames after it instead, when this bridge
   * still has them.
   */
  open(kind: ChannelKind, who: LiveIdentity, address: string, sink: Sink, resumeAfter?: string): Channel {
    const userId = who.user.id;
    const user = this.userEntry(userId);
    const ch = new Channel(kind, user, who.idHash, who.tokenId, address, sink);
    user.channels.add(ch);
    user.lingerUntil = 0;
    this.channels.add(ch);
    this.figures.open[kind]++;
    // Its handshake began before the bridge began to stop.
    if (this.stopped) {
      this.end(ch, 'shutdown');
      return ch;
    }
    // Its session ended, or its token was revoked, after it was authenticated and before it opened.
    if (this.endedLately(who)) {
      this.end(ch, 'session');
      return ch;
    }
    this.startTicker();
    if (kind === 'sse') {
      // A log made now knows nothing of what came before: no resume into it.
      const known = user.sse !== null;
      user.sse ??= { pending: null, frames: [], floor: this.n, busy: Promise.resolve() };
      const after = resumeAfter === undefined ? undefined : this.parseId(resumeAfter);
      if (known && after !== undefined && after >= user.sse.floor && after <= this.n) {
        ch.lastN = after;
        ch.ready = true;
        this.d.log.debug({ event: 'live.opened', kind, userId, resumed: true });
        this.pumpSse(ch);
        return ch;
      }
    }
    this.d.log.debug({ event: 'live.opened', kind, userId });
    void this.snapshot(ch);
    return ch;
  }

  /** The client asked for at most one delta per `ms` (clamped to 0..`live.maxThrottleMs`). */
  setThrottle(ch: Channel, ms: number): void {
    ch.throttleMs = Math.max(0, Math.min(this.cfg.maxThrottleMs, Number.isFinite(ms) ? Math.floor(ms) : 0));
  }

  /** The channel's socket closed (the client left, or after the hub ended it), with the client's close code. */
  closed(ch: Channel, code = 1000): void {
    this.finish(ch, 'client', code);
  }

  /** Ends a channel for `reason`, telling the client why. */
  end(ch: Channel, reason: Exclude<CloseReason, 'client'>): void {
    if (ch.closed) return;
    const { code, text } = CLOSE_CODES[reason];
    this.finish(ch, reason, code);
    try {
      ch.sink.close(code, text);
    } catch {
      // Already gone.
    }
  }

  private finish(ch: Channel, reason: CloseReason, code: number): void {
    if (ch.closed) return;
    ch.closed = true;
    clearTimeout(ch.timer);
    ch.pending = null;
    this.channels.delete(ch);
    this.dirty.delete(ch);
    this.figures.open[ch.kind]--;
    this.figures.closed[reason]++;
    const user = ch.user;
    user.channels.delete(ch);
    this.release(user.id, ch.address);
    if (user.channels.size === 0) {
      if (user.sse && this.cfg.sseResumeMs > 0 && !this.stopped) {
        user.lingerUntil = performance.now() + this.cfg.sseResumeMs;
      } else {
        this.dropUser(user);
      }
    }
    if (this.channels.size === 0 && this.users.size === 0) this.stopTicker();
    this.d.log.info({
      event: 'live.closed',
      kind: ch.kind,
      userId: user.id,
      reason,
      code,
      seconds: Math.round((performance.now() - ch.openedAt) / 1000),
    });
  }

  /** Closes every channel (the bridge stops) and stops following the bus. */
  close(): void {
    this.stopped = true;
    this.unsubscribe();
    for (const ch of [...this.channels]) this.end(ch, 'shutdown');
    for (const user of [...this.users.values()]) this.dropUser(user);
    this.stopTicker();
  }

  /** A session (`s:<idHash>`) or access token (`t:<id>`) that just ended: remembered `ENDED_MEMORY_MS`. */
  private rememberEnded(key: string): void {
    const now = performance.now();
    this.ended.delete(key);
    this.ended.set(key, now);
    // Oldest first: what is too old, or over the bound, goes from the front.
    for (const [k, at] of this.ended) {
      if (now - at <= ENDED_MEMORY_MS && this.ended.size <= ENDED_MEMORY_MAX) break;
      this.ended.delete(k);
    }
  }

  private endedLately(who: LiveIdentity): boolean {
    const key = who.idHash !== undefined ? `s:${who.idHash}` : who.tokenId !== undefined ? `t:${who.tokenId}` : '';
    const at = this.ended.get(key);
    return at !== undefined && performance.now() - at <= ENDED_MEMORY_MS;
  }

  // ---- users and their devices ----

  private userEntry(userId: number): UserEntry {
    let user = this.users.get(userId);
    if (user) return user;
    const entry: UserEntry = {
      id: userId,
      devices: new Set(),
      adding: new Set(),
      loadEdits: null,
      loaded: Promise.resolve(),
      loadFailed: false,
      channels: new Set(),
      sse: null,
      lingerUntil: 0,
    };
    user = entry;
    this.users.set(userId, entry);
    this.load(entry);
    return user;
  }

  /** Reads the user's devices; events that come meanwhile are applied over what it reads. */
  private load(entry: UserEntry): void {
    entry.loadFailed = false;
    entry.loadEdits = new Map();
    entry.loaded = this.d.store.devices.deviceIdsOf(entry.id).then(
      (ids) => {
        const edits = entry.loadEdits ?? new Map<string, boolean>();
        entry.loadEdits = null;
        if (this.users.get(entry.id) !== entry) return;
        for (const id of ids) if (edits.get(id) !== false) this.index(entry, id);
      },
      (err: unknown) => {
        entry.loadEdits = null;
        entry.loadFailed = true;
        throw err;
      },
    );
    // A failure is the snapshot's to report.
    entry.loaded.catch(() => undefined);
  }

  private dropUser(user: UserEntry): void {
    if (this.users.get(user.id) !== user) return;
    this.users.delete(user.id);
    this.dirtySse.delete(user);
    for (const id of user.devices) this.unindex(user, id);
  }

  private index(user: UserEntry, deviceId: string): void {
    user.devices.add(deviceId);
    let set = this.deviceUsers.get(deviceId);
    if (!set) {
      set = new Set();
      this.deviceUsers.set(deviceId, set);
    }
    set.add(user);
  }

  private unindex(user: UserEntry, deviceId: string): void {
    const set = this.deviceUsers.get(deviceId);
    set?.delete(user);
    if (set?.size === 0) this.deviceUsers.delete(deviceId);
  }

  /** A device the user now sees (a claim, a share): `device-claimed`, then its changes. */
  private async addDevice(user: UserEntry, deviceId: string): Promise<void> {
    if (user.devices.has(deviceId)) return;
    user.loadEdits?.set(deviceId, true);
    user.devices.add(deviceId);
    user.adding.add(deviceId);
    this.index(user, deviceId);
    let json: string;
    try {
      json = await liveDeviceJson(this.d.store, deviceId);
    } catch (err) {
      user.adding.delete(deviceId);
      this.removeDevice(user, deviceId, false);
      this.d.log.warn({ event: 'live.read_failed', userId: user.id, deviceId, err: String(err) });
      return;
    }
    if (!user.adding.delete(deviceId) || this.users.get(user.id) !== user) return;
    this.broadcast(user, 'events', claimedFrame(deviceId, json));
    // Changes that came while the device object was read.
    for (const ch of user.channels) if (ch.pending?.has(deviceId)) this.due(ch);
    if (user.sse?.pending?.has(deviceId)) this.scheduleSse(user);
  }

  /** A device the user no longer sees: its waiting changes go, and `device-removed` is sent. */
  private removeDevice(user: UserEntry, deviceId: string, announce = true): void {
    user.loadEdits?.set(deviceId, false);
    if (!user.devices.delete(deviceId)) return;
    user.adding.delete(deviceId);
    this.unindex(user, deviceId);
    for (const ch of user.channels) {
      const keys = ch.pending?.get(deviceId);
      if (keys) {
        ch.pendingCount -= keys.size;
        ch.pending!.delete(deviceId);
      }
    }
    user.sse?.pending?.delete(deviceId);
    if (announce) this.broadcast(user, 'events', removedFrame(deviceId));
  }

  /**
   * A rule of the user fired (docs/notifications.md, "Delivery"): `{"events":{<id>:{"type":"user-event",…}}}` to
   * each of the user's channels, right after its snapshot for one still reading it, and into the SSE log.
   */
  private async userEvent(user: UserEntry, id: number): Promise<void> {
    let frame: string;
    try {
      const event = await this.d.store.rules.event(id);
      if (!event || event.userId !== user.id) return;
      frame = userEventFrame(event);
    } catch (err) {
      this.d.log.warn({ event: 'live.read_failed', userId: user.id, err: String(err) });
      return;
    }
    if (this.users.get(user.id) !== user) return;
    for (const ch of user.channels) {
      if (ch.kind !== 'ws' || ch.closed) continue;
      if (ch.ready) this.write(ch, 'events', frame);
      // Its snapshot is being read: the event follows it (an event is not in a snapshot). Bounded: past that, the
      // event log has them.
      else if (ch.heldEvents.length < HELD_EVENTS_MAX) ch.heldEvents.push(frame);
    }
    if (user.sse) {
      this.append(user.sse, 'events', frame);
      for (const ch of user.channels) if (ch.kind === 'sse') this.pumpSse(ch);
    }
  }

  /** Whether `userId` still sees `deviceId`, asked of the store (after a claim by someone else). */
  private async recheck(user: UserEntry, deviceId: string): Promise<void> {
    try {
      const ids = await this.d.store.devices.deviceIdsOf(user.id);
      if (!ids.includes(deviceId)) this.removeDevice(user, deviceId);
    } catch (err) {
      this.d.log.warn({ event: 'live.read_failed', userId: user.id, deviceId, err: String(err) });
    }
  }

  // ---- the bus ----

  private onEvent(e: DeliveredEvent): void {
    if (this.stopped) return;
    switch (e.type) {
      case 'device.vars': {
        const users = this.deviceUsers.get(e.deviceId);
        if (!users) return;
        const keys = e.vars.map((v) => `${v.type}:${v.name}`);
        for (const user of users) this.mark(user, e.deviceId, keys);
        return;
      }
      case 'device.state': {
        const users = this.deviceUsers.get(e.deviceId);
        if (!users) return;
        for (const user of users) this.mark(user, e.deviceId, ['meta:state']);
        return;
      }
      case 'device.registration': {
        const holders = this.deviceUsers.get(e.deviceId);
        if (e.owned) {
          // Whoever else had it sees it no longer unless the store says they still do (a share that survives).
          if (holders) for (const u of [...holders]) if (u.id !== e.userId) void this.recheck(u, e.deviceId);
          const user = this.users.get(e.userId);
          if (user) void this.addDevice(user, e.deviceId);
        } else if (holders) {
          // An unregister ends the owner's access and every share.
          for (const u of [...holders]) this.removeDevice(u, e.deviceId);
        }
        return;
      }
      case 'device.shared': {
        const user = this.users.get(e.userId);
        if (!user) return;
        if (e.shared) void this.addDevice(user, e.deviceId);
        else this.removeDevice(user, e.deviceId);
        return;
      }
      case 'session.ended': {
        if (e.userId === null) return;
        if (e.idHash !== undefined) this.rememberEnded(`s:${e.idHash}`);
        else if (e.tokenId !== undefined) this.rememberEnded(`t:${e.tokenId}`);
        const user = this.users.get(e.userId);
        if (!user) return;
        // One session (a logout), the channels of one access token (revoked), or all of the user's (a password reset).
        for (const ch of [...user.channels]) {
          const ends =
            e.idHash !== undefined ? ch.idHash === e.idHash : e.tokenId !== undefined ? ch.tokenId === e.tokenId : true;
          if (ends) this.end(ch, 'session');
        }
        return;
      }
      case 'user.event': {
        const user = this.users.get(e.userId);
        if (user) void this.userEvent(user, e.id);
        return;
      }
      case 'bus.resync':
        for (const user of [...this.users.values()]) void this.reload(user);
        return;
      default:
        return;
    }
  }

  /** After missed events: the user's devices read again, and every channel of theirs sent a fresh snapshot. */
  private async reload(user: UserEntry): Promise<void> {
    let ids: readonly string[];
    try {
      await user.loaded;
      ids = await this.d.store.devices.deviceIdsOf(user.id);
    } catch (err) {
      this.d.log.warn({ event: 'live.read_failed', userId: user.id, err: String(err) });
      return;
    }
    if (this.users.get(user.id) !== user) return;
    const now = new Set(ids);
    for (const id of [...user.devices]) if (!now.has(id) && !user.adding.has(id)) this.removeDevice(user, id);
    for (const id of ids) if (!user.devices.has(id)) this.index(user, id);
    if (user.sse) {
      // What was missed is not in the log: a resume from before now gets a snapshot.
      user.sse.frames = [];
      user.sse.pending = null;
      user.sse.floor = this.n;
    }
    for (const ch of user.channels) void this.snapshot(ch);
  }

  // ---- marking and sending ----

  private mark(user: UserEntry, deviceId: string, keys: readonly string[]): void {
    for (const ch of user.channels) {
      if (ch.kind !== 'ws') continue;
      ch.pending ??= new Map();
      let set = ch.pending.get(deviceId);
      if (!set) {
        set = new Set();
        ch.pending.set(deviceId, set);
      }
      for (const k of keys) {
        if (set.has(k)) continue;
        set.add(k);
        ch.pendingCount++;
      }
      if (ch.stalledSince !== 0 && ch.pendingCount > this.cfg.maxPendingKeys) {
        this.end(ch, 'slow');
        continue;
      }
      if (ch.ready && !user.adding.has(deviceId)) this.due(ch);
    }
    if (user.sse) {
      const log = user.sse;
      log.pending ??= new Map();
      let set = log.pending.get(deviceId);
      if (!set) {
        set = new Set();
        log.pending.set(deviceId, set);
      }
      for (const k of keys) set.add(k);
      if (!user.adding.has(deviceId)) this.scheduleSse(user);
    }
  }

  /** Schedules the channel's next frame: on the next round, or once its `throttletime` since the last has passed. */
  private due(ch: Channel): void {
    if (ch.closed || ch.timer !== undefined || this.dirty.has(ch)) return;
    const wait = ch.lastSentAt + ch.throttleMs - performance.now();
    if (wait <= 0) {
      this.dirty.add(ch);
      this.kick();
      return;
    }
    ch.timer = setTimeout(() => {
      ch.timer = undefined;
      if (ch.closed) return;
      this.dirty.add(ch);
      this.kick();
    }, wait);
  }

  private scheduleSse(user: UserEntry): void {
    this.dirtySse.add(user);
    this.kick();
  }

  /** Starts a round of frames unless one runs; a round takes what was marked since the last one. */
  private kick(): void {
    if (this.running) return;
    this.running = true;
    setImmediate(() => void this.round());
  }

  private async round(): Promise<void> {
    try {
      while (this.dirty.size > 0 || this.dirtySse.size > 0) {
        const channels = [...this.dirty];
        this.dirty.clear();
        const users = [...this.dirtySse];
        this.dirtySse.clear();
        // One read per record per round, however many channels wait for it.
        const cache = new Map<string, Promise<string | undefined>>();
        await Promise.all([
          ...channels.map((ch) => this.flush(ch, cache)),
          ...users.map((user) => this.flushSse(user, cache)),
        ]);
      }
    } finally {
      this.running = false;
    }
  }

  private read(deviceId: string, key: string, cache: Map<string, Promise<string | undefined>>) {
    const k = `${deviceId}\n${key}`;
    let p = cache.get(k);
    if (!p) {
      const colon = key.indexOf(':');
      const type = key.slice(0, colon) as VarType;
      p = this.d.store.devices.getVar(deviceId, type, key.slice(colon + 1)).then((v) => v && deltaRecord(v));
      cache.set(k, p);
    }
    return p;
  }

  /**
   * The delta frame of `pending` for `user`, and the keys that must wait (devices still being added). Devices
   * the user no longer sees once the records are read are left out.
   */
  private async build(
    user: UserEntry,
    pending: Pending,
    cache: Map<string, Promise<string | undefined>>,
  ): Promise<{ frame: string | undefined; keep: Pending | undefined }> {
    let keep: Pending | undefined;
    const reads: Array<Promise<[string, Array<[string, string | undefined]>]>> = [];
    for (const [deviceId, keys] of pending) {
      if (!user.devices.has(deviceId)) continue;
      if (user.adding.has(deviceId)) {
        (keep ??= new Map()).set(deviceId, keys);
        continue;
      }
      const all = new Set([...keys, ...ALWAYS]);
      reads.push(
        Promise.all(
          [...all].map(async (k) => [k, await this.read(deviceId, k, cache)] as [string, string | undefined]),
        ).then((recs) => [deviceId, recs]),
      );
    }
    const got = await Promise.all(reads);
    const devices = new Map<string, Record<VarType, Array<[string, string]>>>();
    for (const [deviceId, recs] of got) {
      if (!user.devices.has(deviceId)) continue;
      const types: Record<VarType, Array<[string, string]>> = { d: [], s: [], meta: [] };
      let changed = false;
      for (const [key, rec] of recs) {
        if (rec === undefined) continue;
        const colon = key.indexOf(':');
        types[key.slice(0, colon) as VarType].push([key.slice(colon + 1), rec]);
        changed = true;
      }
      if (changed) devices.set(deviceId, types);
    }
    return { frame: devices.size > 0 ? deltaFrame(devices) : undefined, keep };
  }

  private merge(ch: Channel, keep: Pending): void {
    ch.pending ??= new Map();
    for (const [deviceId, keys] of keep) {
      let set = ch.pending.get(deviceId);
      if (!set) {
        set = new Set();
        ch.pending.set(deviceId, set);
      }
      for (const k of keys) {
        if (set.has(k)) continue;
        set.add(k);
        ch.pendingCount++;
      }
    }
  }

  private async flush(ch: Channel, cache: Map<string, Promise<string | undefined>>): Promise<void> {
    if (ch.closed || !ch.ready || !ch.pending) return;
    if (ch.sink.buffered() > this.cfg.highWaterBytes) {
      this.stall(ch, () => {
        this.dirty.add(ch);
        this.kick();
      });
      return;
    }
    ch.stalledSince = 0;
    const pending = ch.pending;
    ch.pending = null;
    ch.pendingCount = 0;
    let built: Awaited<ReturnType<LiveHub['build']>>;
    try {
      built = await this.build(ch.user, pending, cache);
    } catch (err) {
      this.d.log.warn({ event: 'live.read_failed', userId: ch.user.id, err: String(err) });
      // Tried again at the next change.
      this.merge(ch, pending);
      return;
    }
    if (ch.closed) return;
    if (!ch.ready) {
      // A fresh snapshot is on its way: these keys go after it.
      this.merge(ch, pending);
      return;
    }
    if (built.keep) this.merge(ch, built.keep);
    if (built.frame !== undefined) {
      this.write(ch, 'delta', built.frame);
      ch.lastSentAt = performance.now();
    }
  }

  /** The channel's socket is over the high-water mark: nothing more until it drains. */
  private stall(ch: Channel, resume: () => void): void {
    if (ch.stalledSince === 0) ch.stalledSince = performance.now();
    if (ch.pendingCount > this.cfg.maxPendingKeys) {
      this.end(ch, 'slow');
      return;
    }
    if (ch.waitingDrain) return;
    ch.waitingDrain = true;
    ch.sink.onDrain(() => {
      ch.waitingDrain = false;
      if (!ch.closed) resume();
    });
  }

  private write(ch: Channel, kind: FrameKind, json: string, id?: string): void {
    ch.sink.send(kind, json, id);
    this.figures.frames[ch.kind][kind]++;
  }

  /** A frame for every channel of the user (claims and removals): WebSocket at once, SSE through the log. */
  private broadcast(user: UserEntry, kind: FrameKind, json: string): void {
    for (const ch of user.channels) {
      if (ch.kind !== 'ws') continue;
      if (ch.ready) this.write(ch, kind, json);
      // Its snapshot is being read, perhaps from before this: a new one is read, which has it.
      else if (!ch.closed) void this.snapshot(ch);
    }
    if (user.sse) {
      this.append(user.sse, kind, json);
      for (const ch of user.channels) if (ch.kind === 'sse') this.pumpSse(ch);
    }
  }

  // ---- snapshots ----

  private snapshot(ch: Channel): Promise<void> {
    ch.ready = false;
    const generation = ++ch.snapshots;
    const log = ch.user.sse;
    if (ch.kind === 'sse' && log) return this.serial(log, () => this.takeSnapshot(ch, generation));
    return this.takeSnapshot(ch, generation);
  }

  /** Runs `work` after what the log runs now. */
  private serial(log: SseLog, work: () => Promise<void>): Promise<void> {
    const run = log.busy.then(work);
    log.busy = run.catch(() => undefined);
    return run;
  }

  private async takeSnapshot(ch: Channel, generation: number): Promise<void> {
    const user = ch.user;
    if (ch.closed || generation !== ch.snapshots) return;
    // SSE: the log's frames numbered after this one are built after these reads (`serial`), so they follow it.
    const n = ch.kind === 'sse' ? ++this.n : 0;
    let frame: string;
    try {
      if (user.loadFailed) this.load(user);
      await user.loaded;
      const ids = [...user.devices].filter((id) => !user.adding.has(id));
      const objects = await Promise.all(ids.map(async (id) => [id, await liveDeviceJson(this.d.store, id)] as const));
      frame = devicesFrame(objects.filter(([id]) => user.devices.has(id)));
    } catch (err) {
      this.d.log.warn({ event: 'live.read_failed', userId: user.id, err: String(err) });
      this.end(ch, 'error');
      return;
    }
    // A later snapshot (after a resync, a claim meanwhile) has begun: it is the one sent.
    if (ch.closed || generation !== ch.snapshots) return;
    if (ch.kind === 'sse') {
      this.write(ch, 'devices', frame, this.idOf(n));
      ch.lastN = Math.max(ch.lastN, n);
      ch.ready = true;
      this.pumpSse(ch);
      return;
    }
    this.write(ch, 'devices', frame);
    for (const held of ch.heldEvents.splice(0)) this.write(ch, 'events', held);
    ch.lastSentAt = performance.now();
    ch.ready = true;
    if (ch.pending) this.due(ch);
  }

  // ---- SSE ----

  private idOf(n: number): string {
    return `${n}.${this.tag}`;
  }

  /** The frame number of an id this bridge's hub gave, else undefined. */
  private parseId(id: string): number | undefined {
    const m = /^(\d{1,15})\.([0-9a-f]{8})$/.exec(id.trim());
    if (!m || m[2] !== this.tag) return undefined;
    return Number(m[1]);
  }

  private append(log: SseLog, kind: FrameKind, json: string): void {
    log.frames.push({ n: ++this.n, kind, json });
    while (log.frames.length > this.cfg.sseReplayFrames) log.floor = log.frames.shift()!.n;
  }

  private flushSse(user: UserEntry, cache: Map<string, Promise<string | undefined>>): Promise<void> {
    const log = user.sse;
    if (!log) return Promise.resolve();
    return this.serial(log, () => this.buildSse(user, log, cache));
  }

  private async buildSse(user: UserEntry, log: SseLog, cache: Map<string, Promise<string | undefined>>): Promise<void> {
    if (!log.pending || this.users.get(user.id) !== user) return;
    const pending = log.pending;
    log.pending = null;
    let built: Awaited<ReturnType<LiveHub['build']>>;
    try {
      built = await this.build(user, pending, cache);
    } catch (err) {
      this.d.log.warn({ event: 'live.read_failed', userId: user.id, err: String(err) });
      return;
    }
    if (user.sse !== log) return;
    if (built.keep) {
      log.pending ??= new Map();
      for (const [id, keys] of built.keep) log.pending.set(id, new Set([...(log.pending.get(id) ?? []), ...keys]));
    }
    if (built.frame === undefined) return;
    this.append(log, 'delta', built.frame);
    for (const ch of user.channels) if (ch.kind === 'sse') this.pumpSse(ch);
  }

  /** Writes the log's frames the stream has not had, while its socket takes them. */
  private pumpSse(ch: Channel): void {
    const log = ch.user.sse;
    if (ch.closed || !ch.ready || !log) return;
    if (ch.lastN < log.floor) {
      this.end(ch, 'slow');
      return;
    }
    const frames = log.frames;
    let i = frames.length;
    while (i > 0 && frames[i - 1]!.n > ch.lastN) i--;
    for (; i < frames.length; i++) {
      if (ch.sink.buffered() > this.cfg.highWaterBytes) {
        this.stall(ch, () => this.pumpSse(ch));
        return;
      }
      const f = frames[i]!;
      this.write(ch, f.kind, f.json, this.idOf(f.n));
      ch.lastN = f.n;
    }
    ch.stalledSince = 0;
  }

  // ---- keepalive ----

  private startTicker(): void {
    if (this.ticker || this.stopped) return;
    this.ticker = setInterval(() => this.tick(), this.cfg.pingMs);
    this.ticker.unref();
  }

  private stopTicker(): void {
    clearInterval(this.ticker);
    this.ticker = undefined;
  }

  private tick(): void {
    const now = performance.now();
    for (const ch of [...this.channels]) {
      // A stalled peer reads nothing, our pings included: `live.maxLagMs` is its limit, not a missed pong.
      if (ch.stalledSince !== 0) {
        if (now - ch.stalledSince > this.cfg.maxLagMs) this.end(ch, 'slow');
      } else if (!ch.sink.ping()) this.end(ch, 'ping');
    }
    for (const user of [...this.users.values()]) {
      if (user.channels.size === 0 && user.lingerUntil !== 0 && user.lingerUntil <= now) this.dropUser(user);
    }
    if (this.channels.size === 0 && this.users.size === 0) this.stopTicker();
  }
}
