/**
 * The evaluation of notification rules and the delivery of what they fire (docs/notifications.md, "Evaluation" and
 * "Delivery"). The engine follows the event bus: a change this bridge committed (`source.local`) is evaluated here,
 * against the rules of its device, so that each change is evaluated once whichever bridge handled it; events from
 * other bridges only drop what this one holds of a device's rules.
 *
 * - A level trigger (a comparison, `became`, `offline`/`online`, `firmware …`) fires when its condition starts to
 *   hold, and not again until it held no longer (hysteresis); with `for`, once it has held that long without a break.
 * - An edge trigger (`changed`, `command failed`) fires on each such change.
 * - Each transition is a conditional write of the rule's row in the same transaction as the event it fires, so that
 *   of two bridges exactly one fires, and a crash loses neither the state nor the event.
 * - A rule fires at most once per `notifications.ruleMinIntervalMs`, a user gets at most `userEventsLimit` events per
 *   `userEventsWindowMs`: a fire over either is counted and logged (`rules.suppressed`), its state still moves.
 * - Delivery (the live channel through the bus, e-mail, webhooks through their outbox) comes after the commit and
 *   never holds up evaluation.
 */
import type { Pool } from 'pg';
import type { Logger } from '../../lib/log.js';
import type { AttemptLimiter } from '../accounts/ratelimit.js';
import { RateLimiter, memoryLimiter } from '../accounts/ratelimit.js';
import { SharedRateLimiter } from '../accounts/shared-ratelimit.js';
import type { BridgeConfig } from '../config.js';
import { type BusEvent, type DeliveredEvent, type EventBus, type EventSource, committedValue } from '../events/bus.js';
import type { Mailer } from '../mail/mailer.js';
import type { BridgeStore } from '../store/types.js';
import type { NewUserEvent, Rule, UserEvent } from './store.js';
import { type Trigger, holds, isLevel, parseTrigger, watchedVar } from './trigger.js';

const DAY_MS = 86_400_000;
const HOUR_MS = 3_600_000;
/** Rules whose `for` ran out, taken per check. */
const PENDING_BATCH = 500;
/** Events removed per statement of the retention, so that no write holds the database long. */
const PRUNE_BATCH = 5000;

export interface EngineDeps {
  config: BridgeConfig;
  store: BridgeStore;
  events: EventBus;
  mailer: Mailer;
  log: Logger;
  now: () => number;
  /** With several bridges, the per-user event limit is counted in their database. */
  pool?: Pool;
  /** A new webhook delivery is waiting (the worker polls soon). */
  onWebhook?: () => void;
}

/** A rule with its parsed trigger. */
interface Compiled {
  rule: Rule;
  trigger: Trigger;
  level: boolean;
  /** `type:name` of the variable it watches; none for `command failed`. */
  key: string | undefined;
}

export interface EngineFigures {
  evaluated: number;
  fired: number;
  suppressed: number;
  /** Evaluations that failed (a store error): the change was not evaluated. */
  failed: number;
}

/** What made a rule fire: the variable and its value, or nothing (a command, a test). */
interface Cause {
  varType: 'd' | 's' | 'meta' | null;
  varName: string | null;
  value: Buffer | null;
}

export class RuleEngine {
  /** Devices' rules, least recently used first (a `Map` keeps insertion order). */
  private readonly cache = new Map<string, Promise<Compiled[]>>();
  /** Per device, the evaluation running now: a device's changes are evaluated in the order they came. */
  private readonly chains = new Map<string, Promise<void>>();
  private readonly userLimiter: AttemptLimiter;
  private unsubscribe: (() => void) | undefined;
  private pendingTimer: NodeJS.Timeout | undefined;
  private pruneTimer: NodeJS.Timeout | undefined;
  private checking = false;
  private stopped = false;
  private readonly inFlight = new Set<Promise<unknown>>();
  /**
   * Other bridges may move the rules' state (PostgreSQL: several bridges on one database). A copy held here can be
   * behind theirs, and judged by it a crossing would be missed (a rule this bridge saw fire, armed again by another,
   * looks still fired here); so a change a rule watches is tested against the rules as the database has them.
   */
  private readonly shared: boolean;
  readonly figures: EngineFigures = { evaluated: 0, fired: 0, suppressed: 0, failed: 0 };

  constructor(private readonly d: EngineDeps) {
    this.shared = d.store.engine !== 'sqlite';
    const n = d.config.notifications;
    const opts = { limit: n.userEventsLimit, windowMs: n.userEventsWindowMs, now: d.now };
    this.userLimiter = d.pool
      ? new SharedRateLimiter({ ...opts, pool: d.pool, name: 'userEvents' })
      : memoryLimiter(new RateLimiter(opts));
  }

  start(): void {
    this.unsubscribe = this.d.events.subscribe((e, source) => this.onEvent(e, source));
    const n = this.d.config.notifications;
    this.pendingTimer = setInterval(() => void this.checkPending(), n.pendingCheckMs);
    this.pendingTimer.unref();
    this.pruneTimer = setInterval(() => void this.prune(), HOUR_MS);
    this.pruneTimer.unref();
  }

  /** Stops evaluating; waits for the evaluations and deliveries under way. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.unsubscribe?.();
    clearInterval(this.pendingTimer);
    clearInterval(this.pruneTimer);
    await Promise.allSettled([...this.inFlight]);
  }

  private track<T>(p: Promise<T>): Promise<T> {
    this.inFlight.add(p);
    void p.finally(() => this.inFlight.delete(p)).catch(() => undefined);
    return p;
  }

  // ---- the bus ----

  private onEvent(e: DeliveredEvent, source: EventSource): void {
    if (this.stopped) return;
    switch (e.type) {
      case 'rules.changed':
      case 'device.registration':
      case 'device.shared':
        // Who may see the device, or its rules, changed: read them again at its next change.
        this.cache.delete(e.deviceId);
        return;
      case 'bus.resync':
        this.cache.clear();
        return;
      case 'device.vars': {
        if (!source.local) return;
        const keys = e.vars.filter((v) => v.change === 'version').map((v) => `${v.type}:${v.name}`);
        if (keys.length > 0) this.enqueue(e.deviceId, (rules) => this.onVars(e.deviceId, rules, keys, e));
        return;
      }
      case 'device.state':
        if (source.local) this.enqueue(e.deviceId, (rules) => this.onVars(e.deviceId, rules, ['meta:state']));
        return;
      case 'command.changed':
        if (source.local && e.state === 'failed') {
          this.enqueue(e.deviceId, (rules) => this.onCommandFailed(e.deviceId, rules, e.id));
        }
        return;
      default:
        return;
    }
  }

  /** Runs `work` on the device's rules after the device's earlier evaluations; nothing when it has none. */
  private enqueue(deviceId: string, work: (rules: Compiled[]) => Promise<void>): void {
    const before = this.chains.get(deviceId) ?? Promise.resolve();
    const run = before.then(async () => {
      this.figures.evaluated++;
      try {
        const rules = await this.rulesOf(deviceId);
        if (rules.length > 0) await work(rules);
      } catch (err) {
        this.figures.failed++;
        this.cache.delete(deviceId);
        this.d.log.error({ event: 'rules.evaluate_failed', deviceId, err: String(err) });
      }
    });
    this.chains.set(deviceId, run);
    void this.track(run).then(() => {
      if (this.chains.get(deviceId) === run) this.chains.delete(deviceId);
    });
  }

  /** The device's rules, from memory or (`fresh`, or not held) the store. */
  private rulesOf(deviceId: string, fresh = false): Promise<Compiled[]> {
    if (fresh) this.cache.delete(deviceId);
    const held = this.cache.get(deviceId);
    if (held) {
      // Most recently used last.
      this.cache.delete(deviceId);
      this.cache.set(deviceId, held);
      return held;
    }
    const loading = this.d.store.rules.ofDevice(deviceId).then((rules) => rules.flatMap((r) => this.compile(r)));
    loading.catch(() => this.cache.delete(deviceId));
    this.cache.set(deviceId, loading);
    if (this.cache.size > this.d.config.notifications.cacheDevices) {
      const oldest = this.cache.keys().next().value;
      if (oldest !== undefined) this.cache.delete(oldest);
    }
    return loading;
  }

  private compile(rule: Rule): Compiled[] {
    const parsed = parseTrigger(rule.trigger);
    if (!parsed.ok) {
      // Only parsed triggers are stored; one that no longer parses is skipped, not fatal.
      this.d.log.error({ event: 'rules.bad_trigger', ruleId: rule.id, position: parsed.error.position });
      return [];
    }
    const ref = watchedVar(parsed.trigger);
    return [
      {
        rule,
        trigger: parsed.trigger,
        level: isLevel(parsed.trigger),
        key: ref === undefined ? undefined : `${ref.type}:${ref.name}`,
      },
    ];
  }

  // ---- evaluation ----

  /**
   * Changes of watched variables: each judged by the value committed with it when its publisher gave one (so that of
   * a burst, each value is judged, in order), else by the store's value now.
   */
  private async onVars(deviceId: string, held: Compiled[], keys: string[], event?: BusEvent): Promise<void> {
    let rules = held;
    let reread = !this.shared;
    for (const key of new Set(keys)) {
      if (!rules.some((c) => c.key === key)) continue;
      if (!reread) {
        rules = await this.rulesOf(deviceId, true);
        reread = true;
      }
      const watching = rules.filter((c) => c.key === key);
      if (watching.length === 0) continue;
      const sep = key.indexOf(':');
      const type = key.slice(0, sep) as 'd' | 's' | 'meta';
      const name = key.slice(sep + 1);
      const hint = event && committedValue(event, type, name);
      const value =
        hint !== undefined ? hint : ((await this.d.store.devices.getVar(deviceId, type, name))?.value ?? null);
      const text = value === null ? undefined : value.toString('utf8');
      for (const c of watching) {
        const cause: Cause = { varType: type, varName: name, value };
        if (c.level) await this.level(c, holds(c.trigger, text), cause);
        else await this.changed(c, value, cause);
      }
    }
  }

  private async onCommandFailed(deviceId: string, held: Compiled[], commandId: string): Promise<void> {
    if (!held.some((c) => c.trigger.kind === 'command')) return;
    // The per-rule limit counts from the last event, which another bridge may have fired.
    const rules = this.shared ? await this.rulesOf(deviceId, true) : held;
    for (const c of rules) {
      if (c.trigger.kind !== 'command') continue;
      // An edge: nothing to move, and every failure counts (the rate limits still hold).
      await this.fire(c, { varType: null, varName: null, value: Buffer.from(commandId) }, () => Promise.resolve(true));
    }
  }

  /** A level rule's condition now holds (or not): moves its state, and fires when it starts to hold. */
  private async level(c: Compiled, now: boolean, cause: Cause): Promise<void> {
    const rule = c.rule;
    if (now === rule.active) return;
    const t = this.d.now();
    const forMs = rule.forMs;
    if (!now) {
      const moved = await this.d.store.write((tx) => tx.rules.setActive(rule.id, true, false, null));
      this.settle(c, moved, { active: false, pendingSince: null });
      return;
    }
    if (forMs > 0) {
      const moved = await this.d.store.write((tx) => tx.rules.setActive(rule.id, false, true, t));
      this.settle(c, moved, { active: true, pendingSince: t });
      return;
    }
    const fired = await this.fire(c, cause, (tx) => tx.rules.fire(rule.id));
    if (fired !== 'stale') Object.assign(rule, { active: true, pendingSince: null });
  }

  /** `changed`: a value other than the one the rule last saw. */
  private async changed(c: Compiled, value: Buffer | null, cause: Cause): Promise<void> {
    const rule = c.rule;
    const last = rule.lastValue;
    if (last === null ? value === null : value !== null && last.equals(value)) return;
    const fired = await this.fire(c, cause, (tx) => tx.rules.setLastValue(rule.id, last, value));
    if (fired !== 'stale') rule.lastValue = value;
  }

  /** After a state write: the rule's copy follows it, or, when another bridge moved it first, is read again. */
  private settle(c: Compiled, moved: boolean, state: Pick<Rule, 'active' | 'pendingSince'>): void {
    if (moved) Object.assign(c.rule, state);
    else this.cache.delete(c.rule.deviceId);
  }

  /**
   * Fires a rule: `transition` (in the event's transaction) says whether this call moved the rule; when it did, and
   * neither limit holds it back, the event is logged and delivered. `stale`: another bridge moved it first.
   */
  private async fire(
    c: Compiled,
    cause: Cause,
    transition: (tx: Parameters<Parameters<BridgeStore['write']>[0]>[0], now: number) => Promise<boolean>,
    test = false,
  ): Promise<'fired' | 'suppressed' | 'stale'> {
    const rule = c.rule;
    const n = this.d.config.notifications;
    const t = this.d.now();
    let suppressed: string | undefined;
    if (!test && rule.firedAt !== null && t - rule.firedAt < n.ruleMinIntervalMs) suppressed = 'rule';
    else if (!(await this.userLimiter.take(String(rule.userId))).ok) suppressed = 'user';
    const event = await this.d.store.write(async (tx) => {
      if (!(await transition(tx, t))) return 'stale' as const;
      if (suppressed !== undefined) return undefined;
      if (!test) await tx.rules.fireEdge(rule.id, t);
      return tx.rules.addEvent(this.newEvent(rule, cause, t, test));
    });
    if (event === 'stale') {
      this.cache.delete(rule.deviceId);
      return 'stale';
    }
    if (event === undefined) {
      this.figures.suppressed++;
      this.d.log.warn({ event: 'rules.suppressed', ruleId: rule.id, userId: rule.userId, limit: suppressed });
      return 'suppressed';
    }
    if (!test) rule.firedAt = t;
    this.figures.fired++;
    this.d.log.info({
      event: 'rules.fired',
      ruleId: rule.id,
      userId: rule.userId,
      deviceId: rule.deviceId,
      eventId: event.id,
      test,
    });
    this.deliver(event, rule);
    return 'fired';
  }

  private newEvent(rule: Rule, cause: Cause, at: number, test: boolean): NewUserEvent {
    return {
      userId: rule.userId,
      ruleId: rule.id,
      deviceId: rule.deviceId,
      name: rule.name,
      message: rule.message,
      trigger: rule.trigger,
      varType: cause.varType,
      varName: cause.varName,
      value: cause.value,
      test,
      at,
      emailState: rule.email ? 'pending' : null,
      webhookUrl: rule.webhookUrl,
    };
  }

  /** The rules whose `for` has run out: each fires once, on one bridge. */
  async checkPending(): Promise<void> {
    if (this.checking || this.stopped) return;
    this.checking = true;
    try {
      const due = await this.d.store.rules.duePending(this.d.now(), PENDING_BATCH);
      for (const rule of due) {
        const since = rule.pendingSince;
        if (since === null) continue;
        // Only while its user may still see the device (the device's rules are read with that check).
        const rules = await this.rulesOf(rule.deviceId);
        const c = rules.find((x) => x.rule.id === rule.id);
        if (!c) continue;
        // The row just read is the rule's state now, whichever bridge moved it last.
        Object.assign(c.rule, rule);
        const ref = watchedVar(c.trigger);
        const v = ref && (await this.d.store.devices.getVar(rule.deviceId, ref.type, ref.name));
        const value = v?.value ?? null;
        const cause: Cause = { varType: ref?.type ?? null, varName: ref?.name ?? null, value };
        const fired = await this.fire(c, cause, (tx) => tx.rules.firePending(rule.id, since));
        if (fired !== 'stale') Object.assign(c.rule, { active: true, pendingSince: null });
      }
    } catch (err) {
      this.d.log.error({ event: 'rules.pending_failed', err: String(err) });
    } finally {
      this.checking = false;
    }
  }

  /** `POST /0/user/event/<id>` without fields: the rule fires once as a test, whatever its state. */
  async test(rule: Rule): Promise<UserEvent | 'limited'> {
    const parsed = parseTrigger(rule.trigger);
    const ref = parsed.ok ? watchedVar(parsed.trigger) : undefined;
    const v = ref && (await this.d.store.devices.getVar(rule.deviceId, ref.type, ref.name));
    if (!(await this.userLimiter.take(String(rule.userId))).ok) return 'limited';
    const t = this.d.now();
    const event = await this.d.store.write((tx) =>
      tx.rules.addEvent(
        this.newEvent(
          rule,
          { varType: ref?.type ?? null, varName: ref?.name ?? null, value: v?.value ?? null },
          t,
          true,
        ),
      ),
    );
    this.figures.fired++;
    this.d.log.info({ event: 'rules.fired', ruleId: rule.id, userId: rule.userId, eventId: event.id, test: true });
    this.deliver(event, rule);
    return event;
  }

  // ---- delivery ----

  private deliver(event: UserEvent, rule: Rule): void {
    this.d.events.publish({ type: 'user.event', userId: event.userId, id: event.id });
    if (event.webhookUrl !== null) this.d.onWebhook?.();
    if (rule.email) void this.track(this.email(event));
  }

  private async email(event: UserEvent): Promise<void> {
    const { store, log } = this.d;
    let state: 'sent' | 'failed' | 'skipped' = 'sent';
    try {
      const user = await store.userById(event.userId);
      if (!user) {
        state = 'skipped';
      } else {
        await this.d.mailer.send({
          kind: 'notification',
          to: user.login,
          subject: event.test ? `[test] ${event.name}` : event.name,
          text: mailText(event),
          link: '',
        });
      }
    } catch (err) {
      state = 'failed';
      log.warn({ event: 'rules.email_failed', eventId: event.id, err: err instanceof Error ? err.message : 'failed' });
    }
    try {
      await store.write((tx) => tx.rules.setEmailState(event.id, state));
    } catch (err) {
      log.warn({ event: 'rules.record_failed', eventId: event.id, err: String(err) });
    }
  }

  /** Events past `notifications.eventRetentionDays`, in batches. */
  async prune(): Promise<number> {
    const before = this.d.now() - this.d.config.notifications.eventRetentionDays * DAY_MS;
    let total = 0;
    try {
      for (;;) {
        const n = await this.d.store.write((tx) => tx.rules.pruneEvents(before, PRUNE_BATCH));
        total += n;
        if (n < PRUNE_BATCH || this.stopped) break;
      }
      if (total > 0) this.d.log.info({ event: 'rules.events_pruned', count: total });
    } catch (err) {
      this.d.log.warn({ event: 'rules.prune_failed', err: String(err) });
    }
    return total;
  }
}

/** The e-mail of an event: the rule's message, then what fired it. */
export function mailText(e: UserEvent): string {
  const lines = [e.message === '' ? e.name : e.message, '', `Rule: ${e.name} (${e.trigger})`, `Device: ${e.deviceId}`];
  if (e.varType !== null && e.varName !== null) {
    const v = e.value === null ? '(none)' : e.value.toString('utf8');
    lines.push(`Value of ${e.varType}.${e.varName}: ${v}`);
  }
  lines.push(`Time: ${new Date(e.at).toISOString()}`);
  if (e.test) lines.push('', 'This is a test of the rule.');
  return lines.join('\n') + '\n';
}
