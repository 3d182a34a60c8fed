/**
 * The platform's official JavaScript client (npm `thsq` 1.2.15, a development dependency) for the tests that drive
 * it unmodified (test/compat/): its public API as typed here, a bounded promise around its callbacks, and a
 * recording `request` for its `init` option.
 *
 * The client is a CommonJS singleton with a module-global cookie jar: a file that uses it runs its steps in order on
 * the one client, and ends with `thsq.destroy()`. It is loaded with Node's own `require`, untouched by vitest. Its
 * only seam used is the documented `init` option `request` (the HTTP function it calls): {@link recordingRequest}
 * wraps the real `request`, recording each request and its answer, so that a test can tell a value that arrived
 * over the WebSocket from one the client fetched, and see the form it sent.
 */
import { createRequire } from 'node:module';

/** A variable record as the client caches it (docs/api.md, the variable record). */
export interface VarRecord {
  value?: string;
  time?: number;
  acked?: number;
  synced?: number;
  syncacked?: number;
}
export interface Device {
  id?: string;
  meta: Record<string, VarRecord>;
  d: Record<string, VarRecord>;
  s: Record<string, VarRecord>;
}
export interface HistoryEntry {
  id: number;
  value: string;
  time: number;
}
/** A rule as `GET /0/user/event/<id>` shows it (docs/notifications.md, "Rules"). */
export interface Rule {
  id: number;
  name: string;
  message: string;
  trigger: string;
  deviceid: string;
  email: boolean;
  webhook: string | null;
  state: 'armed' | 'pending' | 'fired';
  lastFired: number | null;
}
/** An event as the event log and the live channel's `user-event` show it (docs/notifications.md). */
export interface UserEvent {
  id: number;
  type: 'user-event';
  rule: number;
  name: string;
  message: string;
  deviceid: string;
  trigger: string;
  variable: { type: string; name: string } | null;
  value: string | null;
  time: number;
  test: boolean;
}
/** What the client hands a callback when the bridge answered an error: the `request` response. */
export interface FailedAnswer {
  statusCode: number;
  body: string;
}
export type Cb<T> = (v: T) => void;

/** The part of the client's public API the tests drive (node_modules/thsq/lib/thsq.js). */
export interface Thsq {
  init(options: Record<string, unknown>, cb: Cb<Record<string, Device> | undefined>): void;
  on(event: string, listener: (...args: never[]) => void): void;
  removeListener(event: string, listener: (...args: never[]) => void): void;
  destroy(): void;
  connected?: boolean;
  userSignup(login: string, password: string, cb: Cb<string | undefined>): void;
  login(login: string, password: string, cb: Cb<unknown>): void;
  logout(cb: Cb<string | undefined>): void;
  getUser(cb: Cb<{ login: string; authcode: string; data: Record<string, string> } | undefined>): void;
  storeUserData(data: Record<string, string>, cb: Cb<void>): void;
  getNetworkDevices(cb: Cb<Record<string, Device> | undefined>): void;
  claimDevice(unique: string, cb: Cb<string | undefined>): void;
  getDevicelist(cb: Cb<Record<string, Device>>): void;
  getDevice(unique: string, cb: Cb<Device | undefined>): void;
  setVariable(
    unique: string,
    type: string,
    name: string,
    value: string,
    options: { timestamp?: number },
    cb: Cb<string | undefined>,
  ): void;
  // Last, so that `bind` takes this one.
  setVariable(unique: string, type: string, name: string, value: string, cb: Cb<string | undefined>): void;
  getVariable(unique: string, type: string, name: string, cb: Cb<VarRecord | undefined>): void;
  getVariableHistory(
    unique: string,
    type: string,
    name: string,
    options: { num?: number; chunksize?: number; startid?: number },
    cb: Cb<HistoryEntry[] | undefined>,
  ): void;
  sendCommand(unique: string, command: string, cb: Cb<string | undefined>): void;
  sendPing(): void;
  setDeviceHistoryFilter(
    filter: ((device: Device, unique: string, type: string, name: string) => boolean) | undefined,
  ): void;
  getFirmwarelist(cb: Cb<Array<{ name: string }> | string>): void;
  createAccessToken(cb: Cb<string | undefined>): void;
  deleteAccessToken(token: string, cb: Cb<string | undefined>): void;
  shareDevice(unique: string, login: string, cb: Cb<string | undefined>): void;
  removeDevice(unique: string, cb: Cb<string | undefined>): void;
  // Notifications (docs/notifications.md): the answer's text on success, the response on an error.
  getNotifications(cb: Cb<Rule[] | undefined>): void;
  addNotification(unique: string, name: string, message: string, trigger: string, cb: Cb<string | FailedAnswer>): void;
  getNotification(id: string, cb: Cb<Rule | FailedAnswer>): void;
  updateNotification(
    id: string,
    unique: string,
    name: string,
    message: string,
    trigger: string,
    cb: Cb<string | FailedAnswer>,
  ): void;
  testNotification(id: string, cb: Cb<string | FailedAnswer>): void;
  removeNotification(id: string, cb: Cb<string | FailedAnswer>): void;
  getEvents(num: number, cb: Cb<UserEvent[] | undefined>): void;
}

/** One request the client made, as the wrapper saw it. */
export interface Seen {
  method: string;
  path: string;
  /** The query, for a GET. */
  qs?: Record<string, unknown>;
  /** The form, for the other methods. */
  form?: Record<string, unknown>;
  status?: number;
  body?: string;
}
type RequestFn = ((opts: Record<string, unknown>, cb: (...a: unknown[]) => void) => unknown) & {
  jar: () => unknown;
};

const load = createRequire(import.meta.url);
export const thsq = load('thsq') as Thsq;
const realRequest = load('request') as RequestFn;

/** A callback of the client as a promise, bounded: a callback that never comes fails the step, naming it. */
export function call<A extends unknown[], T>(
  what: keyof Thsq,
  fn: (...args: [...A, Cb<T>]) => void,
  ...args: A
): Promise<T> {
  const ms = 10_000;
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no callback from ${what} within ${ms} ms`)), ms);
    fn(...args, (v: T) => {
      clearTimeout(timer);
      resolve(v);
    });
  });
}

/** The `request` the client calls (its `init` option): the real one, each call and its answer pushed to `seen`. */
export function recordingRequest(seen: Seen[]): RequestFn {
  return Object.assign(
    (
      opts: Record<string, unknown>,
      cb: (err: unknown, res: { statusCode: number } | undefined, body: string) => void,
    ) => {
      const entry: Seen = {
        method: String(opts.method),
        path: new URL(String(opts.url)).pathname,
        ...(opts.qs ? { qs: opts.qs as Record<string, unknown> } : {}),
        ...(opts.form ? { form: { ...(opts.form as Record<string, unknown>) } } : {}),
      };
      seen.push(entry);
      return realRequest(opts, (...a: unknown[]) => {
        const [err, res, body] = a as [unknown, { statusCode: number } | undefined, string];
        entry.status = res?.statusCode;
        entry.body = body;
        cb(err, res, body);
      });
    },
    { jar: realRequest.jar },
  );
}
