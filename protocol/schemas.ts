/**
 * Payload schemas of the devcloud wire contract (docs/decisions.md §3 and §4), one per topic.
 *
 * Every payload but `state` is a JSON object with an `id`, so that a duplicate delivery (QoS 1 is
 * at-least-once) can be recognised; the handling of every message is idempotent on top of that.
 * `docs/protocol.md` shows an example of each.
 */
import { z } from 'zod';
import { FW_FAILURE_CODE_RE } from './firmware.js';
import type { TopicName } from './topics.js';

/** Decision 12: variable names. */
export const VAR_NAME_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
/** Decision 12: the largest value the protocol carries, in bytes. Each side may configure a smaller one. */
export const MAX_VALUE_BYTES = 64 * 1024;
/** Decision 12: the longest command, in bytes. */
export const MAX_COMMAND_BYTES = 4 * 1024;
/** The most items one batched message carries. Senders split larger batches. */
export const MAX_BATCH_ITEMS = 1000;
/** The most bytes of command output an agent reports. */
export const MAX_OUTPUT_BYTES = 4 * 1024;

const BASE64_RE = /^[A-Za-z0-9+/]*={0,2}$/;
const HEX_RE = /^[0-9a-f]+$/;

export const MessageId = z.string().min(1).max(64);
/** Milliseconds since the Unix epoch. */
export const Stamp = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
export const VarName = z.string().regex(VAR_NAME_RE, 'not a valid variable name');
export const VarType = z.enum(['d', 's']);
/** Which side set a value: part of its version `(name, time, origin)`. */
export const Origin = z.enum(['device', 'cloud']);
/** A push carries a new value; a sync re-sends the current value without changing it (docs/decisions.md §3). */
export const SyncKind = z.enum(['push', 'sync']);
export const Uuid = z.uuid();
/** A device's auth code: its claim token and its key in `GET /0/network/`. */
export const DeviceAuthcode = z.string().regex(HEX_RE).min(16).max(128);
/** A user's authcode as heard on UDP 590 (decision 19), lower-cased. */
export const HeardAuthcode = z.string().regex(HEX_RE).min(8).max(128);
export const Mode = z.enum(['master', 'connected', 'deadleaf']);
export type Mode = z.infer<typeof Mode>;
/**
 * On every `down/` payload, optional: the bridge's clock when it sent the message, so that an agent can keep an
 * offset to the cloud's clock (decision 24, docs/sync.md#clocks). Sent only to agents whose hello says `clock`.
 */
const Now = Stamp.optional();

const base64 = (maxDecodedBytes: number) =>
  z
    .string()
    .max(Math.ceil(maxDecodedBytes / 3) * 4)
    .regex(BASE64_RE, 'not base64')
    .refine((s) => s.length % 4 === 0, 'not base64')
    // The length check above rounds up to whole 3-byte groups; this one counts the decoded bytes exactly.
    .refine(
      (s) => (s.length / 4) * 3 - (s.endsWith('==') ? 2 : s.endsWith('=') ? 1 : 0) <= maxDecodedBytes,
      'too large',
    );

/** The UTF-8 length of a string, in bytes. */
const utf8Bytes = (s: string) => Buffer.byteLength(s, 'utf8');

/**
 * One variable version in a batch. Exactly one of `value` (UTF-8 text), `value64` (bytes that are not
 * valid UTF-8, base64) or `deleted` (a tombstone) is present.
 */
export const VarItem = z
  .object({
    kind: SyncKind,
    type: VarType,
    name: VarName,
    value: z
      .string()
      .refine((s) => utf8Bytes(s) <= MAX_VALUE_BYTES, 'value too large')
      .optional(),
    value64: base64(MAX_VALUE_BYTES).optional(),
    deleted: z.literal(true).optional(),
    time: Stamp,
    origin: Origin,
    /** With `kind: "sync"`: the sender's `synced` stamp, echoed in the acknowledgement. */
    synced: Stamp.optional(),
    /**
     * Device to cloud only: `time` comes from the gateway's own clock, before the agent learnt the cloud's
     * (decision 24). The cloud re-stamps such a version (docs/sync.md#clocks).
     */
    unverified: z.literal(true).optional(),
    /**
     * Cloud to device only: this version answers the device's version with this `time`, which the cloud re-stamped
     * (decision 24, docs/sync.md#clocks); a device that still holds that version takes this one in its place.
     */
    replaces: Stamp.optional(),
  })
  .strict()
  .superRefine((item, ctx) => {
    const encodings = [item.value !== undefined, item.value64 !== undefined, item.deleted === true];
    if (encodings.filter(Boolean).length !== 1) {
      ctx.addIssue({ code: 'custom', message: 'exactly one of value, value64 and deleted must be present' });
    }
    if ((item.kind === 'sync') !== (item.synced !== undefined)) {
      ctx.addIssue({ code: 'custom', message: 'synced is present exactly when kind is "sync"' });
    }
  });
export type VarItem = z.infer<typeof VarItem>;

/** `up/vars` and `down/vars`: a batch of pushes and syncs. */
export const VarsMessage = z
  .object({
    id: MessageId,
    items: z.array(VarItem).max(MAX_BATCH_ITEMS),
    /** Cloud to device only: asks the agent to sync all of its `d` variables (catch-up after data loss). */
    resync: z.boolean().optional(),
    now: Now,
  })
  .strict()
  .refine(
    // With `now` alone, it only tells the time: the bridge's answer to a hello.
    (m) => m.items.length > 0 || m.resync === true || m.now !== undefined,
    'a vars message carries items, asks for a resync or tells the time',
  );
export type VarsMessage = z.infer<typeof VarsMessage>;

/** One acknowledgement: names the version (and, for a sync, the `synced` stamp) it acknowledges. */
export const AckItem = z
  .object({
    kind: SyncKind,
    type: VarType,
    name: VarName,
    time: Stamp,
    origin: Origin,
    synced: Stamp.optional(),
  })
  .strict()
  .refine((a) => (a.kind === 'sync') === (a.synced !== undefined), 'synced is present exactly when kind is "sync"');
export type AckItem = z.infer<typeof AckItem>;

/** `up/acks` and `down/acks`: sent only after the receiver has committed what it acknowledges. */
export const AcksMessage = z
  .object({
    id: MessageId,
    acks: z.array(AckItem).min(1).max(MAX_BATCH_ITEMS),
    now: Now,
  })
  .strict();
export type AcksMessage = z.infer<typeof AcksMessage>;

/** `up/hello`: sent on every connect, before anything else. */
export const HelloMessage = z
  .object({
    id: MessageId,
    protocol: z.literal(1),
    deviceId: Uuid,
    authcode: DeviceAuthcode,
    platform: z.string().min(1).max(128),
    agentVersion: z.string().min(1).max(64),
    fwVersion: z.string().min(1).max(128),
    mode: Mode,
    /** When the agent process started (ms); a change tells the cloud the agent restarted. */
    bootTime: Stamp,
    /** The gateway's own clock when the hello was made, uncorrected: the cloud learns the gateway's skew from it. */
    ts: Stamp,
    /** The agent reads `now` on `down/` payloads (decision 24); a bridge adds it only for such an agent. */
    clock: z.literal(true).optional(),
  })
  .strict();
export type HelloMessage = z.infer<typeof HelloMessage>;

/**
 * `up/meta`: meta variables reported by the device (firmware state, uptime, ...). One entry has a fixed set of
 * values: `fwerrorcode`, optional (an agent that predates it sends none), is empty or a code: one of
 * `FW_FAILURE_CODES` (firmware.ts) or, from a newer agent, a code of the same form.
 */
export const MetaMessage = z
  .object({
    id: MessageId,
    ts: Stamp,
    meta: z
      .record(VarName, z.string().max(4096))
      .refine((m) => Object.keys(m).length > 0, 'meta is empty')
      .refine((m) => m.fwerrorcode === undefined || m.fwerrorcode === '' || FW_FAILURE_CODE_RE.test(m.fwerrorcode), {
        message: 'not a firmware failure code',
        path: ['fwerrorcode'],
      }),
  })
  .strict();
export type MetaMessage = z.infer<typeof MetaMessage>;

/** `up/heard`: user authcodes heard on UDP 590 (decisions 18 and 19). */
export const HeardMessage = z
  .object({
    id: MessageId,
    heard: z
      .array(z.object({ authcode: HeardAuthcode, at: Stamp }).strict())
      .min(1)
      .max(MAX_BATCH_ITEMS),
  })
  .strict();
export type HeardMessage = z.infer<typeof HeardMessage>;

export const CommandState = z.enum(['queued', 'running', 'done', 'failed', 'expired']);
export type CommandState = z.infer<typeof CommandState>;

/** `up/cmd`: the state of one command on the device (docs/decisions.md §6). */
export const CmdStatusMessage = z
  .object({
    id: MessageId,
    cmd: Uuid,
    state: CommandState,
    at: Stamp,
    exitCode: z.number().int().nullable().optional(),
    signal: z.string().max(32).nullable().optional(),
    output: z.string().max(MAX_OUTPUT_BYTES).optional(),
    truncated: z.boolean().optional(),
    reason: z.string().max(1024).optional(),
  })
  .strict();
export type CmdStatusMessage = z.infer<typeof CmdStatusMessage>;

/** `down/cmd`: one command. The bytes travel as base64 so that any command survives JSON. */
export const CmdMessage = z
  .object({
    id: MessageId,
    cmd: Uuid,
    command64: base64(MAX_COMMAND_BYTES).refine((s) => s.length > 0, 'empty command'),
    priority: z.union([z.literal(0), z.literal(1), z.literal(2)]),
    created: Stamp,
    expires: Stamp,
    now: Now,
  })
  .strict();
export type CmdMessage = z.infer<typeof CmdMessage>;

/** `down/fw`: start or cancel a firmware job (docs/decisions.md §7). */
export const FwMessage = z.discriminatedUnion('action', [
  z
    .object({
      id: MessageId,
      action: z.literal('start'),
      job: Uuid,
      name: z.string().min(1).max(256),
      version: z.number().int().min(0),
      platform: z.string().min(1).max(128),
      url: z.url(),
      token: z.string().min(1).max(512),
      size: z.number().int().min(0),
      sha256: z.string().regex(/^[0-9a-f]{64}$/),
      signature: base64(128),
      now: Now,
    })
    .strict(),
  z.object({ id: MessageId, action: z.literal('cancel'), job: Uuid, now: Now }).strict(),
]);
export type FwMessage = z.infer<typeof FwMessage>;

/**
 * `state` (retained): the only payload that is plain text, so that `mosquitto_sub` shows it as it is.
 * `online` on connect, `offline` from the last will or a clean shutdown, `sleeping` when a deadleaf device
 * goes to sleep.
 */
export const StatePayload = z.enum(['online', 'offline', 'sleeping']);
export type StatePayload = z.infer<typeof StatePayload>;

/** The payload type of every topic. */
export interface Payloads {
  state: StatePayload;
  'up/hello': HelloMessage;
  'up/vars': VarsMessage;
  'up/acks': AcksMessage;
  'up/meta': MetaMessage;
  'up/heard': HeardMessage;
  'up/cmd': CmdStatusMessage;
  'down/vars': VarsMessage;
  'down/acks': AcksMessage;
  'down/cmd': CmdMessage;
  'down/fw': FwMessage;
}

export const SCHEMAS: { [K in TopicName]: z.ZodType<Payloads[K]> } = {
  state: StatePayload,
  'up/hello': HelloMessage,
  'up/vars': VarsMessage,
  'up/acks': AcksMessage,
  'up/meta': MetaMessage,
  'up/heard': HeardMessage,
  'up/cmd': CmdStatusMessage,
  'down/vars': VarsMessage,
  'down/acks': AcksMessage,
  'down/cmd': CmdMessage,
  'down/fw': FwMessage,
};
