/**
 * Commands in PostgreSQL: `CommandStore` (bridge/commands/store.ts) translated. A state only moves forward; the
 * comparison is part of each update's `WHERE`, so that two bridges handling two reports of one command at once
 * cannot move it back.
 */
import type { CmdStatusMessage } from '../../../protocol/index.js';
import {
  type BridgeCommandState,
  type CommandRow,
  type NewBridgeCommand,
  RANK,
  type StoredCommand,
  toCommand,
} from '../../commands/store.js';
import type { CommandRepo } from '../types.js';
import type { Conn } from './conn.js';

const RANK_SQL = "CASE state WHEN 'queued' THEN 0 WHEN 'sent' THEN 1 WHEN 'running' THEN 2 ELSE 3 END";

const OPEN = "state IN ('queued', 'sent', 'running')";

export class PgCommandRepo implements CommandRepo {
  constructor(private readonly c: Conn) {}

  async add(cmd: NewBridgeCommand, sentAt?: number): Promise<void> {
    await this.c.query(
      `INSERT INTO commands (id, device_id, user_id, command, priority, created_at, expires_at, state, state_at, sent_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $8::bigint IS NULL THEN 'queued' ELSE 'sent' END, $6, $8)`,
      [cmd.id, cmd.deviceId, cmd.userId, cmd.command, cmd.priority, cmd.createdAt, cmd.expiresAt, sentAt ?? null],
    );
  }

  async countByState(): Promise<Partial<Record<BridgeCommandState, number>>> {
    const r = await this.c.query<{ state: BridgeCommandState; n: number }>(
      'SELECT state, count(*) AS n FROM commands GROUP BY state',
    );
    const out: Partial<Record<BridgeCommandState, number>> = {};
    for (const x of r.rows) out[x.state] = x.n;
    return out;
  }

  async get(id: string): Promise<StoredCommand | undefined> {
    const r = await this.c.query<CommandRow>('SELECT * FROM commands WHERE id = $1', [id]);
    return r.rows[0] && toCommand(r.rows[0]);
  }

  async openCount(deviceId: string): Promise<number> {
    const r = await this.c.query<{ n: number }>(`SELECT count(*) AS n FROM commands WHERE device_id = $1 AND ${OPEN}`, [
      deviceId,
    ]);
    return r.rows[0]?.n ?? 0;
  }

  async open(deviceId: string, afterSeq: number, limit: number): Promise<StoredCommand[]> {
    const r = await this.c.query<CommandRow>(
      `SELECT * FROM commands WHERE device_id = $1 AND ${OPEN} AND seq > $2 ORDER BY seq LIMIT $3`,
      [deviceId, afterSeq, limit],
    );
    return r.rows.map(toCommand);
  }

  async ofDevice(deviceId: string, limit: number, beforeSeq = Number.MAX_SAFE_INTEGER): Promise<StoredCommand[]> {
    const r = await this.c.query<CommandRow>(
      'SELECT * FROM commands WHERE device_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3',
      [deviceId, beforeSeq, limit],
    );
    return r.rows.map(toCommand);
  }

  /** `queued` becomes `sent`; a later state keeps itself, with a new `sent_at`. One statement. */
  async markSent(id: string, now: number): Promise<void> {
    await this.c.query(
      `UPDATE commands SET sent_at = $2,
         state_at = CASE WHEN state = 'queued' THEN $2 ELSE state_at END,
         state = CASE WHEN state = 'queued' THEN 'sent' ELSE state END
       WHERE id = $1`,
      [id, now],
    );
  }

  async report(deviceId: string, msg: CmdStatusMessage): Promise<boolean> {
    if (msg.state === 'queued') {
      // Delivered: the device has it queued; a `queued` command becomes `sent`. The first such report says so.
      const first = await this.c.query(
        `UPDATE commands SET delivered_at = $3,
           sent_at = CASE WHEN state = 'queued' THEN $3 ELSE sent_at END,
           state_at = CASE WHEN state = 'queued' THEN $3 ELSE state_at END,
           state = CASE WHEN state = 'queued' THEN 'sent' ELSE state END
         WHERE id = $1 AND device_id = $2 AND delivered_at IS NULL`,
        [msg.cmd, deviceId, msg.at],
      );
      if ((first.rowCount ?? 0) > 0) return true;
      await this.c.query(
        `UPDATE commands SET state = 'sent', state_at = $3, sent_at = $3
         WHERE id = $1 AND device_id = $2 AND state = 'queued'`,
        [msg.cmd, deviceId, msg.at],
      );
      return false;
    }
    const final = RANK[msg.state] === 3;
    const r = await this.c.query(
      `UPDATE commands SET state = $3, state_at = $4, delivered_at = coalesce(delivered_at, $4),
         started_at = coalesce($5, started_at), finished_at = $6, exit_code = $7, signal = $8, output = $9,
         truncated = $10, reason = $11
       WHERE id = $1 AND device_id = $2 AND ${RANK_SQL} < $12`,
      [
        msg.cmd,
        deviceId,
        msg.state,
        msg.at,
        msg.state === 'running' ? msg.at : null,
        final ? msg.at : null,
        final ? (msg.exitCode ?? null) : null,
        final ? (msg.signal ?? null) : null,
        final ? (msg.output ?? null) : null,
        final && msg.truncated === true,
        msg.reason ?? null,
        RANK[msg.state],
      ],
    );
    return (r.rowCount ?? 0) > 0;
  }

  async expire(now: number): Promise<number> {
    const r = await this.c.query(
      `UPDATE commands SET state = 'expired', state_at = expires_at, finished_at = expires_at,
         reason = 'its lifetime ended before the device received it'
       WHERE state IN ('queued', 'sent') AND delivered_at IS NULL AND expires_at <= $1`,
      [now],
    );
    return r.rowCount ?? 0;
  }

  async prune(before: number, max: number): Promise<number> {
    const r = await this.c.query(
      `DELETE FROM commands WHERE seq IN (
         SELECT seq FROM commands WHERE state IN ('done', 'failed', 'expired') AND state_at < $1
         ORDER BY state_at LIMIT $2)`,
      [before, max],
    );
    return r.rowCount ?? 0;
  }

  async deleteOfDevice(deviceId: string): Promise<void> {
    await this.c.query('DELETE FROM commands WHERE device_id = $1', [deviceId]);
  }
}
