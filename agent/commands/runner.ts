/**
 * Runs the gateway's queued commands (docs/decisions.md §6): highest priority first, first in first out within a
 * priority, `concurrency` at a time (1 by default), never one that has expired. Every state is committed before
 * it is reported on `up/cmd`; a report that did not reach the broker goes again on the next connect.
 *
 * What a command does is chosen by its first word:
 * - built-ins: `ping`, `idfy`, `reboot`, `restart`, `frmt`;
 * - otherwise an executable of that name in the commands folder, run without a shell, the other words as its
 *   arguments, with a timeout, a bounded output and a clean environment.
 * An unknown command fails with a clear reason.
 *
 * After a crash, a command found `running` did not finish: it is reported `failed` ("interrupted"), never run
 * again, except `reboot` and `restart`, whose running state is what the restart they asked for looks like, and
 * which are then `done`, and a handler that was never launched, which goes back to the queue.
 *
 * A handler dies with the agent (docs/agent.md, the command runner): it runs in its own process group, under
 * `setpriv --pdeathsig KILL` where the system has it, and starts only once its process is recorded; at start the
 * agent kills a recorded group that survived (procs.ts).
 */
import { constants as fsConstants } from 'node:fs';
import { access, stat } from 'node:fs/promises';
import { join } from 'node:path';
import type { Writable } from 'node:stream';
import type { Logger } from '../../lib/log.js';
import { type RunInGroup, runInGroup } from '../../lib/process.js';
import type { GroupCommitter } from '../../lib/sqlite.js';
import { type CmdMessage, type CmdStatusMessage, MAX_OUTPUT_BYTES, messageId } from '../../protocol/index.js';
import { type Launcher, findLauncher, groupSurvives, killGroup, processStartTicks } from './procs.js';
import { type Outcome, type QueuedCommand, type CommandQueue, isFinal } from './queue.js';

/** A handler name: the first word of a command. */
const HANDLER_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
export const BUILTINS = ['ping', 'idfy', 'reboot', 'restart', 'frmt'] as const;
type Builtin = (typeof BUILTINS)[number];

/** Between the SIGTERM a handler's group gets at its timeout and the SIGKILL (docs/agent.md, the command runner). */
const KILL_GRACE_MS = 2000;

/** The built-ins that end the agent (or the gateway) while they run. */
const RESTARTING: ReadonlySet<string> = new Set(['reboot', 'restart']);

export interface CommandReporter {
  /** Publishes a report; calls `onAck` when the broker acknowledged it. `false` when not connected. */
  publish(payload: CmdStatusMessage, onAck: () => void): boolean;
  readonly connected: boolean;
}

export interface BuiltinActions {
  /** What `idfy` answers: who this gateway is. */
  identify(): Record<string, unknown>;
  /** Reboots the gateway; resolves with the outcome when the reboot could not be started. */
  reboot(): Promise<Outcome>;
  /** Restarts the agent (its service manager starts it again). */
  restart(): void;
  /** Deletes every variable of the agent; resolves to how many. */
  factoryReset(): Promise<number>;
}

export interface RunnerOptions {
  queue: CommandQueue;
  commit: GroupCommitter;
  reporter: CommandReporter;
  actions: BuiltinActions;
  now: () => number;
  log: Logger;
  concurrency: number;
  /** Where executable handlers live; none: only built-ins. */
  commandsDir: string | undefined;
  timeoutMs: number;
  /** Bytes of output kept (the end of it). */
  outputBytes: number;
  allowFactoryReset: boolean;
  allowReboot: boolean;
  /** Extra environment for handlers (the device id). */
  env: Record<string, string>;
  /** Finished commands are kept this long to answer a repeated delivery, then pruned. */
  keepMs: number;
  /** How handlers are launched; found on the system when not given. */
  launcher?: Launcher;
  /** What runs a handler's process; `runInGroup` when not given (a test may give another). */
  run?: RunInGroup;
}

/** Splits a command into its words (ASCII whitespace). */
function words(command: Buffer): string[] {
  return command
    .toString('utf8')
    .split(/[ \t\r\n]+/)
    .filter((w) => w.length > 0);
}

export class CommandRunner {
  private readonly active = new Map<string, { kill(): void }>();
  private expiryTimer: NodeJS.Timeout | undefined;
  private pruneTimer: NodeJS.Timeout | undefined;
  /** The expiry timer fired: the next pass looks for lapsed commands anywhere in the queue. */
  private expiryDue = false;
  private stopped = false;
  private pumping = false;
  private pumpAgain = false;
  /** Commands stored since the last pass, not reported yet. */
  private readonly unannounced = new Set<string>();
  private reporting = false;
  readonly counters = { received: 0, duplicates: 0, ran: 0, failed: 0, expired: 0 };
  readonly launcher: Launcher;
  private readonly runProcess: RunInGroup;

  constructor(private readonly o: RunnerOptions) {
    this.launcher = o.launcher ?? findLauncher();
    this.runProcess = o.run ?? runInGroup;
  }

  /**
   * At start: what a crash left `running` is settled, then the queue runs. A handler whose process group survived
   * the agent is killed first; one that was never launched is queued again, to run or expire as usual.
   */
  async start(): Promise<void> {
    const { queue, now } = this.o;
    const interrupted = queue.running();
    if (interrupted.length > 0) {
      const settled = interrupted.map((c) => {
        const name = words(c.command)[0] ?? '';
        if (RESTARTING.has(name)) return { c, how: 'restarted' as const, killed: false };
        const handler = !(BUILTINS as readonly string[]).includes(name);
        if (handler && c.pid === null) return { c, how: 'never-launched' as const, killed: false };
        const killed = c.pid !== null && c.pidStart !== null && groupSurvives(c.pid, c.pidStart) && killGroup(c.pid);
        return { c, how: 'interrupted' as const, killed };
      });
      await this.o.commit.run(() => {
        for (const { c, how, killed } of settled) {
          const name = words(c.command)[0] ?? '';
          switch (how) {
            case 'restarted':
              queue.finish(c.id, { state: 'done', reason: `${name} completed` }, now());
              break;
            case 'never-launched':
              queue.requeue(c.id, now());
              break;
            case 'interrupted':
              queue.finish(
                c.id,
                killed
                  ? {
                      state: 'failed',
                      signal: 'SIGKILL',
                      reason: 'interrupted: the agent stopped while it ran; what was left of it was killed',
                    }
                  : { state: 'failed', reason: 'interrupted: the agent stopped while it ran' },
                now(),
              );
              break;
          }
        }
      });
      for (const { c, how, killed } of settled) {
        if (how === 'never-launched') this.o.log.info({ event: 'cmd.requeued', cmd: c.id });
        else if (how === 'interrupted') this.o.log.warn({ event: 'cmd.interrupted', cmd: c.id, pid: c.pid, killed });
      }
    }
    await this.prune();
    // A gateway runs for months between starts: finished commands are removed hourly too.
    this.pruneTimer = setInterval(() => void this.prune(), 3_600_000);
    this.pruneTimer.unref();
    this.pump();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.expiryTimer);
    clearInterval(this.pruneTimer);
    for (const a of this.active.values()) a.kill();
  }

  /** A command from the cloud: stored before anything else; a repeat is answered with its current state. */
  async onCommand(msg: CmdMessage): Promise<void> {
    this.counters.received++;
    const { queue, now } = this.o;
    const command = Buffer.from(msg.command64, 'base64');
    const adding = this.o.commit.run(() =>
      queue.add({ id: msg.cmd, command, priority: msg.priority, created: msg.created, expires: msg.expires }, now()),
    );
    // A pass queued now shares the transaction that stores the command, and may take it in it.
    this.pump();
    const added = await adding;
    if (!added) {
      this.counters.duplicates++;
      const cur = queue.get(msg.cmd);
      if (cur) this.report(cur);
      return;
    }
    this.o.log.info({ event: 'cmd.queued', cmd: msg.cmd, priority: msg.priority, expires: msg.expires });
    // Reported by the pass queued above (its report runs after this line) or by the one already under way: as
    // `queued` if it still waits then, else in the state the pass gave it (taken at once, it needs no `queued`).
    this.unannounced.add(msg.cmd);
  }

  /** Removes finished commands whose last report reached the broker more than `keepMs` ago (1000 at a time). */
  private async prune(): Promise<void> {
    if (this.stopped) return;
    const { queue, now } = this.o;
    await this.o.commit
      .run(() => queue.prune(now() - this.o.keepMs), { durable: false })
      .catch((err: unknown) => this.o.log.warn({ event: 'cmd.prune_failed', err: String(err) }));
  }

  /** On every connect: reports whose state did not reach the broker go again. */
  onConnected(): void {
    void this.reportPending();
  }

  private async reportPending(): Promise<void> {
    if (this.reporting) return;
    this.reporting = true;
    try {
      let after = 0;
      for (;;) {
        if (!this.o.reporter.connected) return;
        const page = this.o.queue.unreported(after, 200);
        for (const c of page) this.report(c);
        if (page.length < 200) return;
        after = page[page.length - 1]!.seq;
        await new Promise((r) => setImmediate(r));
      }
    } finally {
      this.reporting = false;
    }
  }

  private report(c: QueuedCommand): void {
    const msg: CmdStatusMessage = { id: messageId(), cmd: c.id, state: c.state, at: c.stateAt };
    if (isFinal(c.state)) {
      if (c.exitCode !== null) msg.exitCode = c.exitCode;
      if (c.signal !== null) msg.signal = c.signal;
      if (c.output !== null) msg.output = c.output;
      if (c.truncated) msg.truncated = true;
    }
    if (c.reason !== null) msg.reason = c.reason.slice(0, 1024);
    const state = c.state;
    this.o.reporter.publish(msg, () => {
      void this.o.commit.run(() => this.o.queue.markReported(c.id, state), { durable: false }).catch(() => undefined);
    });
  }

  /**
   * Takes what may start now, in one transaction: expired commands are marked expired, instant built-ins run
   * and finish there and then, others are marked running. After the commit, the reports go out and the others
   * start. One pass at a time; a call during a pass asks for another.
   */
  private pump(): void {
    if (this.stopped) return;
    if (this.pumping) {
      this.pumpAgain = true;
      return;
    }
    this.pumping = true;
    this.o.commit
      .run(() => this.take())
      .then((t) => {
        for (const c of [...t.expired, ...t.instant, ...t.started]) {
          this.unannounced.delete(c.id);
          const cur = this.o.queue.get(c.id);
          if (cur) this.report(cur);
        }
        for (const id of this.unannounced) {
          const cur = this.o.queue.get(id);
          if (cur) this.report(cur);
        }
        this.unannounced.clear();
        for (const c of t.started) this.run(c);
        return t.instant.length + t.expired.length > 0;
      })
      .catch((err: unknown) => {
        this.o.log.error({ event: 'cmd.pump_failed', err: String(err) });
        return false;
      })
      .then((more) => {
        this.pumping = false;
        if (more || this.pumpAgain) {
          this.pumpAgain = false;
          this.pump();
        } else this.scheduleExpiry();
      })
      .catch(() => undefined);
  }

  private take(): { expired: QueuedCommand[]; instant: QueuedCommand[]; started: QueuedCommand[] } {
    const { queue, now } = this.o;
    const out = { expired: [] as QueuedCommand[], instant: [] as QueuedCommand[], started: [] as QueuedCommand[] };
    // When the expiry timer fired, lifetimes that ended are settled wherever the commands are in the queue, also
    // while every slot is busy: a command waiting behind a running one is reported expired when its lifetime
    // ends (not when the slot frees), and the timer is not set again for a time already past.
    if (this.expiryDue) {
      this.expiryDue = false;
      const t0 = now();
      const lapsed = queue.lapsed(t0, 500);
      for (const c of lapsed) {
        queue.finish(c.id, { state: 'expired', reason: 'its lifetime ended before it could run' }, t0);
        this.counters.expired++;
        this.o.log.info({ event: 'cmd.expired', cmd: c.id });
        out.expired.push(c);
      }
      if (lapsed.length === 500) this.expiryDue = true;
    }
    // Bounded, so that one transaction stays short however long the queue; the next pass takes the rest.
    for (let n = 0; n < 500 && this.active.size < this.o.concurrency; n++) {
      const next = queue.next();
      if (!next) break;
      const t = now();
      if (next.expires <= t) {
        queue.finish(next.id, { state: 'expired', reason: 'its lifetime ended before it could run' }, t);
        this.counters.expired++;
        this.o.log.info({ event: 'cmd.expired', cmd: next.id });
        out.expired.push(next);
        continue;
      }
      const instant = this.instant(next);
      if (instant) {
        queue.start(next.id, t);
        queue.finish(next.id, instant, t);
        this.counters.ran++;
        out.instant.push(next);
        continue;
      }
      queue.start(next.id, t);
      this.active.set(next.id, { kill: () => undefined });
      out.started.push(next);
    }
    return out;
  }

  /**
   * The built-ins that touch nothing outside the agent's memory (`ping`, `idfy`) run inside the transaction that
   * takes them: there is no moment at which a crash could leave them half done.
   */
  private instant(c: QueuedCommand): Outcome | undefined {
    const [name, ...args] = words(c.command);
    if (name === 'ping')
      return { state: 'done', exitCode: 0, output: args.length > 0 ? `pong ${args.join(' ')}` : 'pong' };
    if (name === 'idfy') {
      const who = this.o.actions.identify();
      this.o.log.warn({ event: 'cmd.identify', ...who, reason: 'the cloud asked this gateway to identify itself' });
      return { state: 'done', exitCode: 0, output: JSON.stringify(who) };
    }
    return undefined;
  }

  /** While commands wait behind a running one, the earliest expiry among them is checked when it comes. */
  private scheduleExpiry(): void {
    clearTimeout(this.expiryTimer);
    this.expiryTimer = undefined;
    if (this.stopped) return;
    const earliest = this.o.queue.earliestExpiry();
    if (earliest === undefined) return;
    const delay = Math.max(0, Math.min(earliest - this.o.now() + 1, 2_147_000_000));
    this.expiryTimer = setTimeout(() => {
      this.expiryDue = true;
      this.pump();
    }, delay);
    this.expiryTimer.unref();
  }

  private run(c: QueuedCommand): void {
    const handle = this.active.get(c.id) ?? { kill: () => undefined };
    this.active.set(c.id, handle);
    this.o.log.info({ event: 'cmd.running', cmd: c.id, priority: c.priority });
    this.execute(c, handle)
      .catch((err: unknown): Outcome => ({ state: 'failed', reason: `the agent could not run it: ${String(err)}` }))
      .then(async (outcome) => {
        if (outcome.state === 'done') this.counters.ran++;
        else this.counters.failed++;
        await this.o.commit.run(() => this.o.queue.finish(c.id, outcome, this.o.now()));
        this.active.delete(c.id);
        this.o.log.info({
          event: 'cmd.finished',
          cmd: c.id,
          state: outcome.state,
          exitCode: outcome.exitCode ?? null,
          ...(outcome.reason === undefined ? {} : { reason: outcome.reason }),
        });
        const cur = this.o.queue.get(c.id);
        if (cur) this.report(cur);
        this.pump();
      })
      .catch((err: unknown) => this.o.log.error({ event: 'cmd.failed_to_record', cmd: c.id, err: String(err) }));
  }

  private async execute(c: QueuedCommand, handle: { kill(): void }): Promise<Outcome> {
    if (c.command.includes(0)) return { state: 'failed', reason: 'the command contains a NUL byte' };
    const [name = '', ...args] = words(c.command);
    if (!HANDLER_RE.test(name)) return { state: 'failed', reason: 'the command does not start with a handler name' };
    if ((BUILTINS as readonly string[]).includes(name)) return this.builtin(name as Builtin, args);
    const dir = this.o.commandsDir;
    if (dir === undefined) return { state: 'failed', reason: `unknown command ${name}: no commands folder is set` };
    const file = join(dir, name);
    try {
      const st = await stat(file);
      if (!st.isFile()) throw new Error('not a file');
      await access(file, fsConstants.X_OK);
    } catch {
      return { state: 'failed', reason: `unknown command ${name}: no executable of that name in the commands folder` };
    }
    return this.spawnHandler(c, file, args, handle);
  }

  private async builtin(name: Builtin, args: string[]): Promise<Outcome> {
    const { actions, log } = this.o;
    switch (name) {
      case 'ping':
      case 'idfy':
        // Taken as instant (see take); here only if one was found running after a crash, which cannot happen.
        return this.instant({ command: Buffer.from([name, ...args].join(' ')) } as QueuedCommand)!;
      case 'frmt': {
        if (!this.o.allowFactoryReset) {
          return { state: 'failed', reason: "factory reset is not allowed by this gateway's config" };
        }
        const n = await actions.factoryReset();
        log.warn({ event: 'cmd.factory_reset', variables: n });
        return { state: 'done', exitCode: 0, output: `deleted ${n} variables` };
      }
      case 'reboot':
        if (!this.o.allowReboot) return { state: 'failed', reason: "reboot is not allowed by this gateway's config" };
        await this.reportedRunning();
        return actions.reboot();
      case 'restart':
        log.warn({ event: 'cmd.restart', reason: 'the cloud asked the agent to restart' });
        await this.reportedRunning();
        actions.restart();
        // The agent is stopping; when it starts again it finds this command running and records it done.
        return new Promise<Outcome>(() => undefined);
    }
  }

  /** Gives the `running` report a moment to reach the broker before the agent goes away. */
  private reportedRunning(): Promise<void> {
    return new Promise((resolve) => setTimeout(resolve, 200).unref());
  }

  private async spawnHandler(
    c: QueuedCommand,
    file: string,
    args: string[],
    handle: { kill(): void },
  ): Promise<Outcome> {
    const limit = Math.min(this.o.outputBytes, MAX_OUTPUT_BYTES);
    const stop = new AbortController();
    handle.kill = () => stop.abort();
    const r = await this.runProcess({
      file,
      args,
      launcher: this.launcher,
      cwd: this.o.commandsDir,
      // A clean environment: what a handler may rely on, nothing of the agent's own.
      env: {
        PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
        LANG: 'C.UTF-8',
        DEVCLOUD_COMMAND_ID: c.id,
        DEVCLOUD_COMMAND64: c.command.toString('base64'),
        DEVCLOUD_COMMAND_PRIORITY: String(c.priority),
        ...this.o.env,
      },
      stdin: 'pipe',
      // stdout and stderr together, in the order they come; the end of it is kept.
      stdout: { maxBytes: limit, keep: 'tail' },
      stderr: 'stdout',
      // In its own process group (runInGroup), so that a timeout stops what it started too, and a crash can be
      // cleaned up: SIGTERM to the group at the timeout, SIGKILL after the grace; SIGKILL at once when stopped.
      timeoutMs: this.o.timeoutMs,
      graceMs: KILL_GRACE_MS,
      signal: stop.signal,
      onSpawn: ({ pid, stdin }) => this.launched(c, pid, stdin!),
    });
    if (r.kind === 'spawn-error') return { state: 'failed', reason: `could not start the handler: ${r.error.message}` };
    const base = { exitCode: r.code, signal: r.signal, output: r.stdout.text, truncated: r.stdout.truncated };
    if (r.timedOut) return { ...base, state: 'failed', reason: `timed out after ${this.o.timeoutMs} ms` };
    if (r.code === 0) return { ...base, state: 'done' };
    if (r.signal !== null) return { ...base, state: 'failed', reason: `killed by ${r.signal}` };
    return { ...base, state: 'failed', reason: `exited with status ${r.code}` };
  }

  /**
   * The launcher waits for one line before it executes the handler: the line goes once the process is recorded on
   * disk, so after a crash a command with no recorded process certainly never started.
   */
  private launched(c: QueuedCommand, pid: number, stdin: Writable): void {
    const pidStart = processStartTicks(pid);
    this.o.commit
      .run(() => this.o.queue.launched(c.id, pid, pidStart))
      .then(
        () => {
          stdin.write('\n');
          stdin.end(c.command);
        },
        (err: unknown) => {
          this.o.log.error({ event: 'cmd.launch_failed', cmd: c.id, err: String(err) });
          stdin.destroy();
        },
      );
  }
}
