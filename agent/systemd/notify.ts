/**
 * The systemd notification protocol (sd_notify(3)) for a `Type=notify` unit: `READY=1` once the agent runs,
 * `WATCHDOG=1` every half of `WatchdogSec=`, `STOPPING=1` when it stops, and `STATUS=` lines. Each message is
 * one datagram to the AF_UNIX socket named by `$NOTIFY_SOCKET`.
 *
 * Without `$NOTIFY_SOCKET` (not started by systemd) every call does nothing. A failure to send never reaches the
 * agent: the first one is logged at debug, later ones are dropped, since the same cause would repeat each time.
 */
import { createRequire } from 'node:module';
import type * as UnixDgram from 'unix-dgram';
import type { Logger } from '../../lib/log.js';

/** Sends one datagram to a socket path; throws when it cannot. */
export type DatagramSend = (path: string, message: Buffer) => void;

export interface NotifierDeps {
  log: Logger;
  env?: NodeJS.ProcessEnv;
  /** The process's pid, compared with `$WATCHDOG_PID`. */
  pid?: number;
  /** Replaces the `unix-dgram` sender (tests). */
  send?: DatagramSend;
}

export interface Notifier {
  /** Where messages go; undefined when notifications are off. */
  readonly socket: string | undefined;
  /** The watchdog ping interval in ms; undefined when systemd watches nothing. */
  readonly watchdogMs: number | undefined;
  ready(status?: string): void;
  stopping(status?: string): void;
  status(text: string): void;
  /** Stops the watchdog pings. */
  close(): void;
}

/** `sun_path` holds 108 bytes, the last one for the terminating NUL. */
const MAX_PATH_BYTES = 107;

/**
 * The `unix-dgram` sender: a socket for each message, closed at once. Messages come seconds apart, and no socket
 * stays open to hold the event loop (the module polls every socket it creates).
 */
function unixDgramSend(): DatagramSend {
  const require = createRequire(import.meta.url);
  const { createSocket } = require('unix-dgram') as typeof UnixDgram;
  return (path, message) => {
    const sock = createSocket('unix_dgram');
    let failure: Error | undefined;
    try {
      sock.send(message, 0, message.length, path, (err) => {
        failure = err;
      });
    } finally {
      sock.close();
    }
    if (failure) throw failure;
  };
}

/** The watchdog interval systemd asks for, halved as sd_watchdog_enabled(3) advises; undefined if none applies. */
export function watchdogInterval(env: NodeJS.ProcessEnv, pid: number): number | undefined {
  const usec = env.WATCHDOG_USEC;
  if (!usec || !/^\d{1,15}$/.test(usec) || Number(usec) === 0) return undefined;
  // WATCHDOG_PID names the process systemd watches; a child that inherited the variables is not it.
  const watched = env.WATCHDOG_PID;
  if (watched && watched !== String(pid)) return undefined;
  return Math.max(1, Math.floor(Number(usec) / 2000));
}

export function createNotifier(deps: NotifierDeps): Notifier {
  const env = deps.env ?? process.env;
  const log = deps.log;
  let path = env.NOTIFY_SOCKET || undefined;
  let warned = false;
  const fail = (msg: string, err?: unknown) => {
    if (warned) return;
    warned = true;
    log.debug({
      event: 'systemd.notify_failed',
      socket: path,
      msg,
      err: err instanceof Error ? err.message : undefined,
    });
  };

  if (path !== undefined && !path.startsWith('/')) {
    // `@name` (abstract) and `vsock:` addresses: unix-dgram can only address a socket by its path.
    fail('only a socket path is supported in NOTIFY_SOCKET');
    path = undefined;
  } else if (path !== undefined && Buffer.byteLength(path) > MAX_PATH_BYTES) {
    fail('NOTIFY_SOCKET is longer than a socket path can be');
    path = undefined;
  }

  let send: DatagramSend | undefined;
  if (path !== undefined) {
    try {
      send = deps.send ?? unixDgramSend();
    } catch (err) {
      fail('cannot load unix-dgram', err);
      path = undefined;
    }
  }

  const notify = (...lines: string[]) => {
    if (path === undefined || send === undefined) return;
    try {
      send(path, Buffer.from(lines.join('\n')));
    } catch (err) {
      fail('cannot send to NOTIFY_SOCKET', err);
    }
  };

  const watchdogMs = path === undefined ? undefined : watchdogInterval(env, deps.pid ?? process.pid);
  // A ping proves the event loop still turns; the timer does not keep the process alive.
  const timer = watchdogMs === undefined ? undefined : setInterval(() => notify('WATCHDOG=1'), watchdogMs).unref();

  const withStatus = (line: string, status?: string) =>
    status ? notify(line, `STATUS=${oneLine(status)}`) : notify(line);
  return {
    socket: path,
    watchdogMs,
    ready: (status) => withStatus('READY=1', status),
    stopping: (status) => withStatus('STOPPING=1', status),
    status: (text) => notify(`STATUS=${oneLine(text)}`),
    close: () => clearInterval(timer),
  };
}

/** A status is one line: a newline would start another assignment. */
function oneLine(s: string): string {
  return s.replace(/[\r\n]+/g, ' ');
}
