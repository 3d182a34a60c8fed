/**
 * Notification rules and the event log in SQLite (docs/notifications.md): the tables, their rows as both engines
 * read them, and the synchronous store the SQLite engine wraps (`bridge/store/sqlite.ts`). PostgreSQL's is
 * `bridge/store/postgres/rules.ts`, with the same statements.
 *
 * A rule's evaluation state lives in its row, so that every bridge on one database agrees on it and a restart
 * forgets nothing (docs/notifications.md, "Evaluation"): `active` (the condition held at the last change),
 * `pending_since` (held since then, waiting out `for`), `last_value` (what `changed` compares with) and `fired_at`
 * (the per-rule rate limit). Every transition is a conditional `UPDATE` on the state it expects, so that of two
 * bridges evaluating one rule at once exactly one makes it, and exactly one fires.
 */
import type { Db, Migration } from '../../lib/sqlite.js';
import type { VarType } from '../devices/store.js';

/** Migration 9 (PostgreSQL's 4): rules and the event log. */
export const RULES_MIGRATION: Migration = (db) => {
  db.exec(`
    CREATE TABLE rules (
      -- AUTOINCREMENT: a removed rule's number is never given to a later one (the event log names it).
      id             INTEGER PRIMARY KEY AUTOINCREMENT,
      user_id        INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
      device_id      TEXT    NOT NULL REFERENCES devices (id) ON DELETE CASCADE,
      name           TEXT    NOT NULL,
      message        TEXT    NOT NULL,
      trigger        TEXT    NOT NULL,
      for_ms         INTEGER NOT NULL DEFAULT 0,
      email          INTEGER NOT NULL DEFAULT 0,
      webhook_url    TEXT,
      webhook_secret TEXT,
      created_at     INTEGER NOT NULL,
      updated_at     INTEGER NOT NULL,
      active         INTEGER NOT NULL DEFAULT 0,
      pending_since  INTEGER,
      last_value     BLOB,
      fired_at       INTEGER
    );
    CREATE INDEX rules_user ON rules (user_id, id);
    CREATE INDEX rules_device ON rules (device_id);
    CREATE INDEX rules_pending ON rules (pending_since) WHERE pending_since IS NOT NULL;
    CREATE TABLE user_events (
      id                  INTEGER PRIMARY KEY AUTOINCREMENT,
      user_id             INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
      rule_id             INTEGER,
      device_id           TEXT    NOT NULL,
      name                TEXT    NOT NULL,
      message             TEXT    NOT NULL,
      trigger             TEXT    NOT NULL,
      var_type            TEXT,
      var_name            TEXT,
      value               BLOB,
      test                INTEGER NOT NULL DEFAULT 0,
      at                  INTEGER NOT NULL,
      email_state         TEXT,
      webhook_url         TEXT,
      webhook_state       TEXT,
      webhook_attempts    INTEGER NOT NULL DEFAULT 0,
      webhook_status      INTEGER,
      webhook_error       TEXT,
      webhook_at          INTEGER,
      webhook_next_at     INTEGER,
      webhook_lease_until INTEGER
    );
    CREATE INDEX user_events_user ON user_events (user_id, id);
    CREATE INDEX user_events_at ON user_events (at);
    CREATE INDEX user_events_webhook_due ON user_events (webhook_next_at) WHERE webhook_state = 'pending';
  `);
};

export interface Rule {
  id: number;
  userId: number;
  deviceId: string;
  name: string;
  message: string;
  /** The trigger's canonical text (bridge/rules/trigger.ts, `formatTrigger`). */
  trigger: string;
  /** The trigger's `for`, ms; 0 when it has none. Kept beside the text for the query of pending rules. */
  forMs: number;
  email: boolean;
  webhookUrl: string | null;
  /** The key webhook bodies are signed with; shown to the rule's user, never logged. */
  webhookSecret: string | null;
  createdAt: number;
  updatedAt: number;
  /** The condition held at the last change the rule saw. */
  active: boolean;
  /** When the condition started to hold, while a `for` runs; `null` otherwise. */
  pendingSince: number | null;
  /** `changed`: the value the rule last saw (`null`: none). */
  lastValue: Buffer | null;
  firedAt: number | null;
}

export type NewRule = Pick<
  Rule,
  | 'userId'
  | 'deviceId'
  | 'name'
  | 'message'
  | 'trigger'
  | 'forMs'
  | 'email'
  | 'webhookUrl'
  | 'webhookSecret'
  | 'createdAt'
  | 'lastValue'
>;

/** What an update may change; a new trigger or device starts the rule's state afresh (with `lastValue`). */
export type RulePatch = Partial<
  Pick<Rule, 'deviceId' | 'name' | 'message' | 'trigger' | 'forMs' | 'email' | 'webhookUrl' | 'webhookSecret'>
> & { lastValue?: Buffer | null; updatedAt: number };

export type EmailState = 'pending' | 'sent' | 'failed' | 'skipped';
export type WebhookState = 'pending' | 'delivered' | 'failed';

export interface UserEvent {
  id: number;
  userId: number;
  /** The rule that fired; the number stays in the log after the rule is removed. */
  ruleId: number | null;
  deviceId: string;
  name: string;
  message: string;
  trigger: string;
  varType: VarType | null;
  varName: string | null;
  /** The variable's value when the rule fired; `null`: none (a missing variable, a command, a test). */
  value: Buffer | null;
  test: boolean;
  at: number;
  emailState: EmailState | null;
  webhookUrl: string | null;
  webhookState: WebhookState | null;
  webhookAttempts: number;
  webhookStatus: number | null;
  webhookError: string | null;
  webhookAt: number | null;
}

export type NewUserEvent = Omit<
  UserEvent,
  'id' | 'webhookState' | 'webhookAttempts' | 'webhookStatus' | 'webhookError' | 'webhookAt'
>;

/** A webhook delivery due for an attempt, with the rule's signing key (bridge/rules/webhook-worker.ts). */
export interface DueWebhook {
  event: UserEvent;
  secret: string | null;
}

export interface WebhookRecord {
  state: WebhookState;
  attempts: number;
  status: number | null;
  error: string | null;
  at: number;
  nextAt: number | null;
}

/** A row of `rules` as either engine reads it: flags are SQLite's 0/1 or PostgreSQL's BOOLEAN. */
export interface RuleRow {
  id: number;
  user_id: number;
  device_id: string;
  name: string;
  message: string;
  trigger: string;
  for_ms: number;
  email: number | boolean;
  webhook_url: string | null;
  webhook_secret: string | null;
  created_at: number;
  updated_at: number;
  active: number | boolean;
  pending_since: number | null;
  last_value: Buffer | null;
  fired_at: number | null;
}

export interface UserEventRow {
  id: number;
  user_id: number;
  rule_id: number | null;
  device_id: string;
  name: string;
  message: string;
  trigger: string;
  var_type: VarType | null;
  var_name: string | null;
  value: Buffer | null;
  test: number | boolean;
  at: number;
  email_state: EmailState | null;
  webhook_url: string | null;
  webhook_state: WebhookState | null;
  webhook_attempts: number;
  webhook_status: number | null;
  webhook_error: string | null;
  webhook_at: number | null;
}

export function toRule(r: RuleRow): Rule {
  return {
    id: Number(r.id),
    userId: Number(r.user_id),
    deviceId: r.device_id,
    name: r.name,
    message: r.message,
    trigger: r.trigger,
    forMs: Number(r.for_ms),
    email: Boolean(r.email),
    webhookUrl: r.webhook_url,
    webhookSecret: r.webhook_secret,
    createdAt: Number(r.created_at),
    updatedAt: Number(r.updated_at),
    active: Boolean(r.active),
    pendingSince: r.pending_since === null ? null : Number(r.pending_since),
    lastValue: r.last_value,
    firedAt: r.fired_at === null ? null : Number(r.fired_at),
  };
}

export function toUserEvent(r: UserEventRow): UserEvent {
  return {
    id: Number(r.id),
    userId: Number(r.user_id),
    ruleId: r.rule_id === null ? null : Number(r.rule_id),
    deviceId: r.device_id,
    name: r.name,
    message: r.message,
    trigger: r.trigger,
    varType: r.var_type,
    varName: r.var_name,
    value: r.value,
    test: Boolean(r.test),
    at: Number(r.at),
    emailState: r.email_state,
    webhookUrl: r.webhook_url,
    webhookState: r.webhook_state,
    webhookAttempts: Number(r.webhook_attempts),
    webhookStatus: r.webhook_status === null ? null : Number(r.webhook_status),
    webhookError: r.webhook_error,
    webhookAt: r.webhook_at === null ? null : Number(r.webhook_at),
  };
}

/**
 * The rules a device's changes are evaluated against: those whose user owns the device or has it shared (decision
 * 23). A rule of a user who lost the device stays, and fires again should the user get it back.
 */
export const RULES_OF_DEVICE_SQL = `
  SELECT r.* FROM rules r JOIN devices d ON d.id = r.device_id
  WHERE r.device_id = $1
    AND (d.owner_id = r.user_id
         OR (d.owner_id IS NOT NULL
             AND EXISTS (SELECT 1 FROM device_shares s WHERE s.device_id = r.device_id AND s.user_id = r.user_id)))
  ORDER BY r.id`;

/** The columns `addEvent` writes, in order. */
const EVENT_COLUMNS = [
  'user_id',
  'rule_id',
  'device_id',
  'name',
  'message',
  'trigger',
  'var_type',
  'var_name',
  'value',
  'test',
  'at',
  'email_state',
  'webhook_url',
  'webhook_state',
  'webhook_next_at',
] as const;

/** The values of {@link EVENT_COLUMNS}; a webhook URL makes the delivery pending at once. */
export function eventValues(e: NewUserEvent, flag: (b: boolean) => number | boolean): unknown[] {
  return [
    e.userId,
    e.ruleId,
    e.deviceId,
    e.name,
    e.message,
    e.trigger,
    e.varType,
    e.varName,
    e.value,
    flag(e.test),
    e.at,
    e.emailState,
    e.webhookUrl,
    e.webhookUrl === null ? null : 'pending',
    e.webhookUrl === null ? null : e.at,
  ];
}

export const INSERT_EVENT_SQL = `INSERT INTO user_events (${EVENT_COLUMNS.join(', ')})
  VALUES (${EVENT_COLUMNS.map((_, i) => `$${i + 1}`).join(', ')}) RETURNING *`;

/** SQLite's placeholders for a statement written with PostgreSQL's `$n` (same order). */
const sqlite = (sql: string) => sql.replace(/\$\d+/g, '?');

const b = (x: boolean) => (x ? 1 : 0);

export class RuleStore {
  private readonly s;

  constructor(db: Db) {
    this.s = {
      insert: db.prepare<unknown[], RuleRow>(
        `INSERT INTO rules (user_id, device_id, name, message, trigger, for_ms, email, webhook_url, webhook_secret,
                            created_at, updated_at, last_value)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING *`,
      ),
      get: db.prepare<[number, number], RuleRow>('SELECT * FROM rules WHERE id = ? AND user_id = ?'),
      byId: db.prepare<[number], RuleRow>('SELECT * FROM rules WHERE id = ?'),
      ofUser: db.prepare<[number], RuleRow>('SELECT * FROM rules WHERE user_id = ? ORDER BY id'),
      count: db.prepare<[number], number>('SELECT count(*) FROM rules WHERE user_id = ?').pluck(),
      remove: db.prepare<[number, number], RuleRow>('DELETE FROM rules WHERE id = ? AND user_id = ? RETURNING *'),
      ofDevice: db.prepare<[string], RuleRow>(sqlite(RULES_OF_DEVICE_SQL)),
      setActive: db.prepare<[number, number | null, number, number], unknown>(
        'UPDATE rules SET active = ?, pending_since = ? WHERE id = ? AND active = ?',
      ),
      fire: db.prepare<[number], unknown>(
        'UPDATE rules SET active = 1, pending_since = NULL WHERE id = ? AND active = 0',
      ),
      firePending: db.prepare<[number, number], unknown>(
        'UPDATE rules SET pending_since = NULL WHERE id = ? AND pending_since = ?',
      ),
      fireEdge: db.prepare<[number, number], unknown>('UPDATE rules SET fired_at = ? WHERE id = ?'),
      setLastValue: db.prepare<[Buffer | null, number, Buffer | null], unknown>(
        'UPDATE rules SET last_value = ? WHERE id = ? AND last_value IS ?',
      ),
      duePending: db.prepare<[number, number], RuleRow>(
        `SELECT * FROM rules WHERE pending_since IS NOT NULL AND pending_since + for_ms <= ?
         ORDER BY pending_since LIMIT ?`,
      ),
      insEvent: db.prepare<unknown[], UserEventRow>(sqlite(INSERT_EVENT_SQL)),
      event: db.prepare<[number], UserEventRow>('SELECT * FROM user_events WHERE id = ?'),
      events: db.prepare<[number, number, number], UserEventRow>(
        'SELECT * FROM user_events WHERE user_id = ? AND id < ? ORDER BY id DESC LIMIT ?',
      ),
      setEmail: db.prepare<[string, number], unknown>('UPDATE user_events SET email_state = ? WHERE id = ?'),
      prune: db.prepare<[number, number], unknown>(
        'DELETE FROM user_events WHERE id IN (SELECT id FROM user_events WHERE at < ? ORDER BY at LIMIT ?)',
      ),
      due: db.prepare<[number, number, number], UserEventRow & { secret: string | null }>(
        `SELECT e.*, r.webhook_secret AS secret FROM user_events e LEFT JOIN rules r ON r.id = e.rule_id
         WHERE e.webhook_state = 'pending' AND e.webhook_next_at <= ?
           AND (e.webhook_lease_until IS NULL OR e.webhook_lease_until <= ?)
         ORDER BY e.webhook_next_at LIMIT ?`,
      ),
      lease: db.prepare<[number, number], unknown>('UPDATE user_events SET webhook_lease_until = ? WHERE id = ?'),
      record: db.prepare<[string, number, number | null, string | null, number, number | null, number], unknown>(
        `UPDATE user_events SET webhook_state = ?, webhook_attempts = ?, webhook_status = ?, webhook_error = ?,
           webhook_at = ?, webhook_next_at = ?, webhook_lease_until = NULL WHERE id = ?`,
      ),
    };
    this.db = db;
  }

  private readonly db: Db;

  create(r: NewRule): Rule {
    const row = this.s.insert.get(
      r.userId,
      r.deviceId,
      r.name,
      r.message,
      r.trigger,
      r.forMs,
      b(r.email),
      r.webhookUrl,
      r.webhookSecret,
      r.createdAt,
      r.createdAt,
      r.lastValue,
    );
    if (!row) throw new Error('the rule was not written');
    return toRule(row);
  }

  get(userId: number, id: number): Rule | undefined {
    const row = this.s.get.get(id, userId);
    return row && toRule(row);
  }

  byId(id: number): Rule | undefined {
    const row = this.s.byId.get(id);
    return row && toRule(row);
  }

  ofUser(userId: number): Rule[] {
    return this.s.ofUser.all(userId).map(toRule);
  }

  countOfUser(userId: number): number {
    return this.s.count.get(userId) ?? 0;
  }

  update(userId: number, id: number, patch: RulePatch): Rule | undefined {
    const { sql, values } = updateStatement(patch, b, () => '?');
    const row = this.db
      .prepare<unknown[], RuleRow>(`UPDATE rules SET ${sql} WHERE id = ? AND user_id = ? RETURNING *`)
      .get(...values, id, userId);
    return row && toRule(row);
  }

  remove(userId: number, id: number): Rule | undefined {
    const row = this.s.remove.get(id, userId);
    return row && toRule(row);
  }

  ofDevice(deviceId: string): Rule[] {
    return this.s.ofDevice.all(deviceId).map(toRule);
  }

  setActive(id: number, from: boolean, to: boolean, pendingSince: number | null): boolean {
    return this.s.setActive.run(b(to), pendingSince, id, b(from)).changes === 1;
  }

  fire(id: number): boolean {
    return this.s.fire.run(id).changes === 1;
  }

  firePending(id: number, pendingSince: number): boolean {
    return this.s.firePending.run(id, pendingSince).changes === 1;
  }

  fireEdge(id: number, now: number): void {
    this.s.fireEdge.run(now, id);
  }

  setLastValue(id: number, expected: Buffer | null, value: Buffer | null): boolean {
    return this.s.setLastValue.run(value, id, expected).changes === 1;
  }

  duePending(now: number, limit: number): Rule[] {
    return this.s.duePending.all(now, limit).map(toRule);
  }

  addEvent(e: NewUserEvent): UserEvent {
    const row = this.s.insEvent.get(...eventValues(e, b));
    if (!row) throw new Error('the event was not written');
    return toUserEvent(row);
  }

  event(id: number): UserEvent | undefined {
    const row = this.s.event.get(id);
    return row && toUserEvent(row);
  }

  events(userId: number, limit: number, before?: number): UserEvent[] {
    return this.s.events.all(userId, before ?? Number.MAX_SAFE_INTEGER, limit).map(toUserEvent);
  }

  setEmailState(id: number, state: EmailState): void {
    this.s.setEmail.run(state, id);
  }

  pruneEvents(before: number, max: number): number {
    return this.s.prune.run(before, max).changes;
  }

  claimDueWebhooks(now: number, limit: number, leaseMs: number): DueWebhook[] {
    const rows = this.s.due.all(now, now, limit);
    for (const r of rows) this.s.lease.run(now + leaseMs, r.id);
    return rows.map((r) => ({ event: toUserEvent(r), secret: r.secret }));
  }

  recordWebhook(id: number, w: WebhookRecord): void {
    this.s.record.run(w.state, w.attempts, w.status, w.error, w.at, w.nextAt, id);
  }
}

/** The `SET` list of a rule's update and its values; `param(i)` spells the i-th placeholder (from 1). */
export function updateStatement(
  patch: RulePatch,
  flag: (x: boolean) => number | boolean,
  param: (i: number) => string,
): { sql: string; values: unknown[] } {
  const sets: string[] = [];
  const values: unknown[] = [];
  const set = (column: string, value: unknown) => {
    values.push(value);
    sets.push(`${column} = ${param(values.length)}`);
  };
  if (patch.deviceId !== undefined) set('device_id', patch.deviceId);
  if (patch.name !== undefined) set('name', patch.name);
  if (patch.message !== undefined) set('message', patch.message);
  if (patch.trigger !== undefined) set('trigger', patch.trigger);
  if (patch.forMs !== undefined) set('for_ms', patch.forMs);
  if (patch.email !== undefined) set('email', flag(patch.email));
  if (patch.webhookUrl !== undefined) set('webhook_url', patch.webhookUrl);
  if (patch.webhookSecret !== undefined) set('webhook_secret', patch.webhookSecret);
  if (patch.trigger !== undefined || patch.deviceId !== undefined) {
    // A new condition, or another device: what the rule saw before says nothing about it.
    sets.push('active = ' + (flag(false) === false ? 'false' : '0'), 'pending_since = NULL');
    set('last_value', patch.lastValue ?? null);
  }
  set('updated_at', patch.updatedAt);
  return { sql: sets.join(', '), values };
}
