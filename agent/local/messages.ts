/**
 * The local interface for gateway applications: newline-delimited JSON over a Unix socket.
 * `docs/agent.md` documents every request with an example.
 */
import { z } from 'zod';
import { LOG_LEVELS } from '../../lib/log.js';
import { encodeValue } from '../../protocol/index.js';
import type { VarRecord } from '../vars/store.js';

/** The longest request line; a value of 64 KiB in base64 fits with room to spare. */
export const MAX_LINE_BYTES = 1024 * 1024;

const Id = z.union([z.number().int(), z.string().max(64)]);
const Type = z.enum(['d', 's']).default('d');
const Name = z.string().min(1).max(256);

export const LocalRequest = z.discriminatedUnion('op', [
  z.object({ op: z.literal('list'), id: Id, type: Type }).strict(),
  z.object({ op: z.literal('get'), id: Id, type: Type, name: Name }).strict(),
  z
    .object({
      op: z.literal('set'),
      id: Id,
      type: Type,
      name: Name,
      value: z.string().optional(),
      value64: z.base64().optional(),
    })
    .strict()
    .refine((r) => (r.value === undefined) !== (r.value64 === undefined), 'give exactly one of value and value64'),
  z.object({ op: z.literal('rm'), id: Id, type: Type, name: Name }).strict(),
  z.object({ op: z.literal('sync'), id: Id, type: Type, name: Name }).strict(),
  z.object({ op: z.literal('watch'), id: Id }).strict(),
  z.object({ op: z.literal('status'), id: Id }).strict(),
  z.object({ op: z.literal('queue'), id: Id, recent: z.number().int().min(0).max(1000).default(20) }).strict(),
  z.object({ op: z.literal('log-level'), id: Id, level: z.enum(LOG_LEVELS) }).strict(),
  z.object({ op: z.literal('fw-status'), id: Id }).strict(),
  z.object({ op: z.literal('fw-commit'), id: Id }).strict(),
  z.object({ op: z.literal('fw-rollback'), id: Id, reason: z.string().min(1).max(200).optional() }).strict(),
]);
export type LocalRequest = z.infer<typeof LocalRequest>;

/** A variable as the local interface shows it. */
export interface VarJson {
  type: 'd' | 's';
  name: string;
  value?: string;
  value64?: string;
  deleted?: true;
  time: number;
  origin: 'device' | 'cloud';
  acked: number;
  synced: number;
  syncacked: number;
  /** Stamped by the gateway's own clock before the agent learnt the cloud's (docs/sync.md#clocks). */
  unverified?: true;
}

export function varJson(rec: VarRecord): VarJson {
  return {
    type: rec.type,
    name: rec.name,
    ...(rec.value === null ? { deleted: true as const } : encodeValue(rec.value)),
    time: rec.time,
    origin: rec.origin,
    acked: rec.acked,
    synced: rec.synced,
    syncacked: rec.syncacked,
    ...(rec.unverified ? { unverified: true as const } : {}),
  };
}

export type LocalResponse =
  | { id: string | number | null; ok: true; result: unknown }
  | { id: string | number | null; ok: false; error: { code: string; message: string } };

/** Lines sent to a watcher after its `watch` request was answered. */
export type WatchEvent =
  { event: 'change'; source: 'local' | 'cloud'; var: VarJson } | { event: 'acked' | 'syncacked'; var: VarJson };

/** A command as `devcloud-agent queue` shows it. */
export interface CommandJson {
  id: string;
  command?: string;
  command64?: string;
  priority: number;
  state: string;
  received: number;
  expires: number;
  stateAt: number;
  exitCode: number | null;
  reason: string | null;
  output: string | null;
  truncated: boolean;
}

/** The queue: what waits and runs, in run order, and the most recent commands of any state. */
export interface QueueJson {
  running: CommandJson[];
  queued: CommandJson[];
  recent: CommandJson[];
}
