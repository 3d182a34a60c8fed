/**
 * Mosquitto's dynamic security plugin, driven through `$CONTROL/dynamic-security/v1` (docs/operations.md,
 * "Mosquitto in production"). The bridge's own credential is the plugin's admin (made with
 * `mosquitto_ctrl dynsec init`); with it the bridge
 *
 * - sets up what it needs at every connect: the default ACL access (everything denied but unsubscribing), its
 *   own role (`devcloud-bridge`: publish to every device's `down/`, read everything a device publishes, also
 *   through a shared subscription), and the enrolment client when open enrolment is on;
 * - makes one client per device (username the device id, password the device secret, client id fixed to the
 *   device id, so that a device's login cannot take another client's id), with a role of its own that allows
 *   only its own topics; it is made when the secret is known: at provisioning and at enrolment, since the
 *   bridge keeps only the secret's hash;
 * - disables a device's client when the device is unregistered, and enables it again when it is claimed;
 * - enrols devices: an agent without provisioning publishes its id and secret on {@link ENROL_TOPIC} with the
 *   enrolment credential, which may do nothing else; the bridge makes its client unless the id is taken.
 */
import { randomBytes } from 'node:crypto';
import mqtt, { type MqttClient } from 'mqtt';
import { z } from 'zod';
import type { Logger } from '../../lib/log.js';
import { mqttClientOptions } from '../../lib/mqtt-options.js';
import { safeUrl } from '../../lib/url.js';
import { ENROL_TOPIC, TOPIC_ROOT, isDeviceId } from '../../protocol/index.js';

export const DYNSEC_TOPIC = '$CONTROL/dynamic-security/v1';
export const DYNSEC_RESPONSE_TOPIC = `${DYNSEC_TOPIC}/response`;
export { ENROL_TOPIC };
export const BRIDGE_ROLE = 'devcloud-bridge';
export const ENROL_ROLE = 'devcloud-enrol';

export function deviceRole(deviceId: string): string {
  return `devcloud-device-${deviceId}`;
}

export interface Acl {
  acltype: 'publishClientSend' | 'publishClientReceive' | 'subscribePattern' | 'unsubscribePattern';
  topic: string;
  allow: boolean;
}

/** A device's own topics (protocol/topics.ts): it publishes `up/…` and `state`, and reads its `down/…`. */
export function deviceAcls(deviceId: string): Acl[] {
  if (!isDeviceId(deviceId)) throw new TypeError(`not a device id: ${JSON.stringify(deviceId)}`);
  const base = `${TOPIC_ROOT}/${deviceId}`;
  return [
    { acltype: 'publishClientSend', topic: `${base}/up/#`, allow: true },
    { acltype: 'publishClientSend', topic: `${base}/state`, allow: true },
    { acltype: 'subscribePattern', topic: `${base}/down/#`, allow: true },
    { acltype: 'publishClientReceive', topic: `${base}/down/#`, allow: true },
  ];
}

export const BRIDGE_ACLS: readonly Acl[] = [
  { acltype: 'publishClientSend', topic: `${TOPIC_ROOT}/+/down/#`, allow: true },
  { acltype: 'subscribePattern', topic: `${TOPIC_ROOT}/#`, allow: true },
  // Mosquitto checks a subscription against the filter as sent, `$share/<group>/` and all (docs/scaling.md); what
  // it delivers is checked against the message's topic, as for any subscription.
  { acltype: 'subscribePattern', topic: `$share/+/${TOPIC_ROOT}/#`, allow: true },
  { acltype: 'publishClientReceive', topic: `${TOPIC_ROOT}/#`, allow: true },
];

const ENROL_ACLS: Acl[] = [{ acltype: 'publishClientSend', topic: ENROL_TOPIC, allow: true }];

/** What an enrolling agent publishes on {@link ENROL_TOPIC}: the identity it made (agent/identity.ts). */
export const EnrolRequest = z
  .object({ deviceId: z.string().regex(/^[0-9a-f-]{36}$/), secret: z.string().min(16).max(256) })
  .strict();
export type EnrolRequest = z.infer<typeof EnrolRequest>;

export class DynsecError extends Error {
  override name = 'DynsecError';
}

type Command = { command: string } & Record<string, unknown>;
interface Response {
  command: string;
  error?: string;
  data?: unknown;
  correlationData?: string;
}

export interface DynsecOptions {
  url: string;
  /** The bridge's credential: the plugin's admin. */
  username: string;
  password: string;
  ca?: Buffer | undefined;
  /** A client id of its own, next to the bridge's data connection. */
  clientId: string;
  /** The bridges' share group (docs/scaling.md): each enrolment request goes to one bridge of the group. */
  shareGroup?: string | undefined;
  log: Logger;
  /** How long a command waits for its answer. */
  timeoutMs?: number;
  /** Keep reconnecting (the running bridge); a one-shot tool gives up at the first failure. */
  reconnect?: boolean;
}

export interface DynsecSetup {
  bridgeUsername: string;
  enrolUsername: string;
  /** The enrolment credential's password, when open enrolment is on; without it that client is disabled. */
  enrolPassword?: string | undefined;
}

/** One connection to Mosquitto as the dynamic security admin. */
export class Dynsec {
  private readonly pending = new Map<string, { resolve: (r: Response) => void; timer: NodeJS.Timeout }>();
  private enrolHandler: ((req: EnrolRequest) => void) | undefined;

  /** Settles at the first connect: resolved once subscribed and `onConnect` succeeded, rejected otherwise. */
  readonly ready: Promise<void>;
  private readonly client: MqttClient;

  /**
   * Connects and subscribes to the plugin's answers (and, once {@link onEnrol} is called, to enrolment
   * requests). `onConnect` runs at every connect, the first one included. With `reconnect` the client keeps
   * trying after a failure; without it the first failure is final.
   */
  constructor(
    private readonly opts: DynsecOptions,
    onConnect?: (d: Dynsec) => Promise<void>,
  ) {
    const options = mqttClientOptions({
      clientId: opts.clientId,
      username: opts.username,
      password: opts.password,
      clean: true,
      keepaliveSec: 30,
      connectTimeoutMs: 10_000,
      reconnectPeriodMs: opts.reconnect ? 1000 : 0,
      // Commands and their answers only: mqtt.js's queueing and write cache as they come.
      lean: false,
      tls: { ca: opts.ca },
    });
    const client = mqtt.connect(opts.url, options);
    this.client = client;
    client.on('message', (topic, payload) => this.onMessage(topic, payload));
    const where = safeUrl(opts.url);
    this.ready = new Promise((resolve, reject) => {
      let first = true;
      const settle = (err?: Error) => {
        if (!first) return;
        first = false;
        if (err === undefined) resolve();
        else reject(err);
      };
      client.on('connect', () => {
        void (async () => {
          try {
            const topics = this.enrolHandler ? [DYNSEC_RESPONSE_TOPIC, this.enrolFilter] : [DYNSEC_RESPONSE_TOPIC];
            const granted = await client.subscribeAsync(topics, { qos: 1 });
            if (granted.some((g) => g.qos === 128)) throw new DynsecError('the broker refused the subscription');
            await onConnect?.(this);
            opts.log.info({ event: 'dynsec.connected', url: where });
            settle();
          } catch (err) {
            opts.log.error({ event: 'dynsec.setup_failed', url: where, err: (err as Error).message });
            settle(err instanceof Error ? err : new DynsecError('setup failed'));
          }
        })();
      });
      client.on('error', (err) => {
        opts.log.warn({ event: 'dynsec.error', url: where, err: err.message });
        if (!opts.reconnect) settle(new DynsecError(`no connection to the MQTT broker at ${where}: ${err.message}`));
      });
      client.on('close', () => {
        if (!opts.reconnect) settle(new DynsecError(`no connection to the MQTT broker at ${where}`));
      });
    });
    // A caller that never awaits `ready` must not see an unhandled rejection.
    this.ready.catch(() => undefined);
  }

  get connected(): boolean {
    return this.client.connected;
  }

  /** Where enrolment requests are read: through the share group when there is one. */
  private get enrolFilter(): string {
    const group = this.opts.shareGroup;
    return group === undefined ? ENROL_TOPIC : `$share/${group}/${ENROL_TOPIC}`;
  }

  /** Reads enrolment requests; subscribes to them now, and again at every reconnect. */
  async onEnrol(handler: (req: EnrolRequest) => void): Promise<void> {
    this.enrolHandler = handler;
    await this.client.subscribeAsync(this.enrolFilter, { qos: 1 });
  }

  /** Sends one command; resolves to the plugin's error text, `undefined` when it succeeded. */
  async run(command: Command): Promise<string | undefined> {
    return (await this.ask(command)).error;
  }

  /** Sends one command; resolves to the plugin's whole answer. */
  private async ask(command: Command): Promise<Response> {
    if (!this.client.connected) throw new DynsecError('not connected to the MQTT broker');
    const correlationData = randomBytes(8).toString('hex');
    const answer = new Promise<Response>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(correlationData);
        reject(new DynsecError(`no answer to ${command.command} from the dynamic security plugin`));
      }, this.opts.timeoutMs ?? 10_000);
      timer.unref();
      this.pending.set(correlationData, { resolve, timer });
    });
    await this.client.publishAsync(DYNSEC_TOPIC, JSON.stringify({ commands: [{ ...command, correlationData }] }), {
      qos: 1,
    });
    return answer;
  }

  /** Sends one command that must succeed; errors saying what `tolerate` says are taken as success. */
  private async must(command: Command, tolerate?: RegExp): Promise<void> {
    const error = await this.run(command);
    if (error !== undefined && !(tolerate?.test(error) ?? false)) {
      throw new DynsecError(`${command.command} failed: ${error}`);
    }
  }

  /** Makes a role with its ACLs, or completes the one that exists. */
  private async ensureRole(rolename: string, acls: readonly Acl[]): Promise<void> {
    await this.must({ command: 'createRole', rolename }, /exists/i);
    for (const acl of acls) await this.must({ command: 'addRoleACL', rolename, ...acl }, /exists/i);
  }

  /**
   * Gives a client a role it does not have yet (the plugin answers a second grant with an error, and
   * disconnects the client at every change of its roles).
   */
  private async ensureClientRole(username: string, rolename: string): Promise<void> {
    const r = await this.ask({ command: 'getClient', username });
    if (r.error !== undefined) throw new DynsecError(`getClient ${username} failed: ${r.error}`);
    const roles = (r.data as { client?: { roles?: Array<{ rolename?: string }> } } | undefined)?.client?.roles ?? [];
    if (roles.some((x) => x.rolename === rolename)) return;
    await this.must({ command: 'addClientRole', username, rolename });
  }

  /** What the bridge needs at the broker; safe to run again. */
  async setup(s: DynsecSetup): Promise<void> {
    await this.must({
      command: 'setDefaultACLAccess',
      acls: [
        { acltype: 'publishClientSend', allow: false },
        { acltype: 'publishClientReceive', allow: false },
        { acltype: 'subscribe', allow: false },
        { acltype: 'unsubscribe', allow: true },
      ],
    });
    await this.ensureRole(BRIDGE_ROLE, BRIDGE_ACLS);
    await this.ensureClientRole(s.bridgeUsername, BRIDGE_ROLE);
    const username = s.enrolUsername;
    const password = s.enrolPassword;
    if (password !== undefined) {
      await this.ensureRole(ENROL_ROLE, ENROL_ACLS);
      const made = await this.run({
        command: 'createClient',
        username,
        password,
        clientid: username,
        roles: [{ rolename: ENROL_ROLE }],
      });
      if (made !== undefined) {
        if (!/exists/i.test(made)) throw new DynsecError(`createClient ${username} failed: ${made}`);
        await this.must({ command: 'setClientPassword', username, password });
        await this.ensureClientRole(username, ENROL_ROLE);
        await this.must({ command: 'enableClient', username });
      }
    } else {
      // No enrolment: a credential left from before must not work.
      await this.must({ command: 'disableClient', username }, /not found/i);
    }
  }

  /**
   * Makes a device's client and role. Resolves `false` when the client exists already (the id is taken);
   * a device id is never given a second secret.
   */
  async createDevice(deviceId: string, secret: string): Promise<boolean> {
    const rolename = deviceRole(deviceId);
    await this.ensureRole(rolename, deviceAcls(deviceId));
    const error = await this.run({
      command: 'createClient',
      username: deviceId,
      password: secret,
      clientid: deviceId,
      roles: [{ rolename }],
    });
    if (error === undefined) return true;
    if (/exists/i.test(error)) return false;
    throw new DynsecError(`createClient ${deviceId} failed: ${error}`);
  }

  /** Enables or disables a device's client (disabling also disconnects it); `false` when there is none. */
  async setEnabled(deviceId: string, enabled: boolean): Promise<boolean> {
    const error = await this.run({ command: enabled ? 'enableClient' : 'disableClient', username: deviceId });
    if (error === undefined) return true;
    if (/not found/i.test(error)) return false;
    throw new DynsecError(`${enabled ? 'enableClient' : 'disableClient'} ${deviceId} failed: ${error}`);
  }

  async close(): Promise<void> {
    for (const p of this.pending.values()) clearTimeout(p.timer);
    this.pending.clear();
    await new Promise<void>((resolve) => {
      this.client.end(false, {}, () => resolve());
      setTimeout(resolve, 1000).unref();
    });
    this.client.removeAllListeners();
    this.client.on('error', () => undefined);
  }

  private onMessage(topic: string, payload: Buffer): void {
    if (topic === ENROL_TOPIC) {
      let parsed: ReturnType<typeof EnrolRequest.safeParse>;
      try {
        parsed = EnrolRequest.safeParse(JSON.parse(payload.toString('utf8')));
      } catch {
        parsed = EnrolRequest.safeParse(undefined);
      }
      if (!parsed.success || !isDeviceId(parsed.data.deviceId)) {
        this.opts.log.warn({ event: 'dynsec.enrol_refused', reason: 'malformed request', bytes: payload.length });
        return;
      }
      this.enrolHandler?.(parsed.data);
      return;
    }
    if (topic !== DYNSEC_RESPONSE_TOPIC) return;
    let responses: Response[] = [];
    try {
      responses = (JSON.parse(payload.toString('utf8')) as { responses?: Response[] }).responses ?? [];
    } catch {
      return;
    }
    for (const r of responses) {
      const p = r.correlationData === undefined ? undefined : this.pending.get(r.correlationData);
      if (!p) continue;
      this.pending.delete(r.correlationData!);
      clearTimeout(p.timer);
      p.resolve(r);
    }
  }
}
