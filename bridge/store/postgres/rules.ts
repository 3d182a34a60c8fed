/**
 * Notification rules and the event log in PostgreSQL: `RuleStore` (bridge/rules/store.ts) translated. Each state
 * transition's expected state is part of its `WHERE`, so that of two bridges evaluating one rule at once exactly one
 * makes it (docs/notifications.md, "Evaluation"); a webhook delivery is leased with `FOR UPDATE SKIP LOCKED`, so that
 * two bridges polling at once take different ones.
 */
import {
  type DueWebhook,
  type EmailState,
  INSERT_EVENT_SQL,
  type NewRule,
  type NewUserEvent,
  RULES_OF_DEVICE_SQL,
  type Rule,
  type RulePatch,
  type RuleRow,
  type UserEvent,
  type UserEventRow,
  type WebhookRecord,
  eventValues,
  toRule,
  toUserEvent,
  updateStatement,
} from '../../rules/store.js';
import type { RuleRepo } from '../types.js';
import type { Conn } from './conn.js';

const flag = (x: boolean) => x;

export class PgRuleRepo implements RuleRepo {
  constructor(private readonly c: Conn) {}

  async create(r: NewRule): Promise<Rule> {
    const res = await this.c.query<RuleRow>(
      `INSERT INTO rules (user_id, device_id, name, message, trigger, for_ms, email, webhook_url, webhook_secret,
                          created_at, updated_at, last_value)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11) RETURNING *`,
      [
        r.userId,
        r.deviceId,
        r.name,
        r.message,
        r.trigger,
        r.forMs,
        r.email,
        r.webhookUrl,
        r.webhookSecret,
        r.createdAt,
        r.lastValue,
      ],
    );
    const row = res.rows[0];
    if (!row) throw new Error('the rule was not written');
    return toRule(row);
  }

  async get(userId: number, id: number): Promise<Rule | undefined> {
    const r = await this.c.query<RuleRow>('SELECT * FROM rules WHERE id = $1 AND user_id = $2', [id, userId]);
    return r.rows[0] && toRule(r.rows[0]);
  }

  async byId(id: number): Promise<Rule | undefined> {
    const r = await this.c.query<RuleRow>('SELECT * FROM rules WHERE id = $1', [id]);
    return r.rows[0] && toRule(r.rows[0]);
  }

  async ofUser(userId: number): Promise<Rule[]> {
    const r = await this.c.query<RuleRow>('SELECT * FROM rules WHERE user_id = $1 ORDER BY id', [userId]);
    return r.rows.map(toRule);
  }

  async countOfUser(userId: number): Promise<number> {
    const r = await this.c.query<{ n: number }>('SELECT count(*)::int AS n FROM rules WHERE user_id = $1', [userId]);
    return r.rows[0]?.n ?? 0;
  }

  async update(userId: number, id: number, patch: RulePatch): Promise<Rule | undefined> {
    const { sql, values } = updateStatement(patch, flag, (i) => `$${i}`);
    const n = values.length;
    const r = await this.c.query<RuleRow>(
      `UPDATE rules SET ${sql} WHERE id = $${n + 1} AND user_id = $${n + 2} RETURNING *`,
      [...values, id, userId],
    );
    return r.rows[0] && toRule(r.rows[0]);
  }

  async remove(userId: number, id: number): Promise<Rule | undefined> {
    const r = await this.c.query<RuleRow>('DELETE FROM rules WHERE id = $1 AND user_id = $2 RETURNING *', [id, userId]);
    return r.rows[0] && toRule(r.rows[0]);
  }

  async ofDevice(deviceId: string): Promise<Rule[]> {
    const r = await this.c.query<RuleRow>(RULES_OF_DEVICE_SQL, [deviceId]);
    return r.rows.map(toRule);
  }

  async setActive(id: number, from: boolean, to: boolean, pendingSince: number | null): Promise<boolean> {
    const r = await this.c.query('UPDATE rules SET active = $1, pending_since = $2 WHERE id = $3 AND active = $4', [
      to,
      pendingSince,
      id,
      from,
    ]);
    return r.rowCount === 1;
  }

  async fire(id: number): Promise<boolean> {
    const r = await this.c.query('UPDATE rules SET active = true, pending_since = NULL WHERE id = $1 AND NOT active', [
      id,
    ]);
    return r.rowCount === 1;
  }

  async firePending(id: number, pendingSince: number): Promise<boolean> {
    const r = await this.c.query('UPDATE rules SET pending_since = NULL WHERE id = $1 AND pending_since = $2', [
      id,
      pendingSince,
    ]);
    return r.rowCount === 1;
  }

  async fireEdge(id: number, now: number): Promise<void> {
    await this.c.query('UPDATE rules SET fired_at = $1 WHERE id = $2', [now, id]);
  }

  async setLastValue(id: number, expected: Buffer | null, value: Buffer | null): Promise<boolean> {
    const r = await this.c.query(
      'UPDATE rules SET last_value = $1 WHERE id = $2 AND last_value IS NOT DISTINCT FROM $3',
      [value, id, expected],
    );
    return r.rowCount === 1;
  }

  async duePending(now: number, limit: number): Promise<Rule[]> {
    const r = await this.c.query<RuleRow>(
      `SELECT * FROM rules WHERE pending_since IS NOT NULL AND pending_since + for_ms <= $1
       ORDER BY pending_since LIMIT $2`,
      [now, limit],
    );
    return r.rows.map(toRule);
  }

  async addEvent(e: NewUserEvent): Promise<UserEvent> {
    const r = await this.c.query<UserEventRow>(INSERT_EVENT_SQL, eventValues(e, flag));
    const row = r.rows[0];
    if (!row) throw new Error('the event was not written');
    return toUserEvent(row);
  }

  async event(id: number): Promise<UserEvent | undefined> {
    const r = await this.c.query<UserEventRow>('SELECT * FROM user_events WHERE id = $1', [id]);
    return r.rows[0] && toUserEvent(r.rows[0]);
  }

  async events(userId: number, limit: number, before?: number): Promise<UserEvent[]> {
    const r = await this.c.query<UserEventRow>(
      'SELECT * FROM user_events WHERE user_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3',
      [userId, before ?? Number.MAX_SAFE_INTEGER, limit],
    );
    return r.rows.map(toUserEvent);
  }

  async setEmailState(id: number, state: EmailState): Promise<void> {
    await this.c.query('UPDATE user_events SET email_state = $1 WHERE id = $2', [state, id]);
  }

  async pruneEvents(before: number, max: number): Promise<number> {
    const r = await this.c.query(
      'DELETE FROM user_events WHERE id IN (SELECT id FROM user_events WHERE at < $1 ORDER BY at LIMIT $2)',
      [before, max],
    );
    return r.rowCount ?? 0;
  }

  async claimDueWebhooks(now: number, limit: number, leaseMs: number): Promise<DueWebhook[]> {
    const r = await this.c.query<UserEventRow & { secret: string | null }>(
      `WITH due AS (
         SELECT id FROM user_events
         WHERE webhook_state = 'pending' AND webhook_next_at <= $1
           AND (webhook_lease_until IS NULL OR webhook_lease_until <= $1)
         ORDER BY webhook_next_at LIMIT $2 FOR UPDATE SKIP LOCKED)
       UPDATE user_events e SET webhook_lease_until = $3 FROM due WHERE e.id = due.id
       RETURNING e.*, (SELECT r.webhook_secret FROM rules r WHERE r.id = e.rule_id) AS secret`,
      [now, limit, now + leaseMs],
    );
    return r.rows.map((row) => ({ event: toUserEvent(row), secret: row.secret }));
  }

  async recordWebhook(id: number, w: WebhookRecord): Promise<void> {
    await this.c.query(
      `UPDATE user_events SET webhook_state = $1, webhook_attempts = $2, webhook_status = $3, webhook_error = $4,
         webhook_at = $5, webhook_next_at = $6, webhook_lease_until = NULL WHERE id = $7`,
      [w.state, w.attempts, w.status, w.error, w.at, w.nextAt, id],
    );
  }
}
