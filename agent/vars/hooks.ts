/**
 * The change hook: an executable that gateway integrators configure to react to variable changes. It runs
 * without a shell, one change at a time in commit order, with the change in its environment:
 * DEVCLOUD_VAR_TYPE, DEVCLOUD_VAR_NAME, DEVCLOUD_VAR_VALUE (or DEVCLOUD_VAR_VALUE64 for bytes that are not
 * UTF-8), DEVCLOUD_VAR_DELETED=1 for a deletion, DEVCLOUD_VAR_ORIGIN, DEVCLOUD_VAR_TIME.
 */
import type { Logger } from '../../lib/log.js';
import { type RunInGroup, runInGroup } from '../../lib/process.js';
import { encodeValue } from '../../protocol/index.js';
import type { ChangeEvent } from './sync.js';

/** Changes waiting for the hook; past this the oldest are dropped with a warning. */
const MAX_QUEUED = 1000;
/** Bytes of the hook's stderr kept for `hook.failed` (the start of it). */
const STDERR_HEAD = 512;

export interface HookOptions {
  exec: string;
  origins: ReadonlyArray<'cloud' | 'device'>;
  timeoutMs: number;
  log: Logger;
  /** What runs the hook; `runInGroup` when not given (a test may give another). */
  run?: RunInGroup;
}

export class ChangeHook {
  private readonly queue: ChangeEvent[] = [];
  private running = false;
  readonly counters = { ran: 0, failed: 0, dropped: 0 };

  constructor(private readonly opts: HookOptions) {}

  onChange(ev: ChangeEvent): void {
    if (!this.opts.origins.includes(ev.record.origin)) return;
    if (this.queue.length >= MAX_QUEUED) {
      this.queue.shift();
      this.counters.dropped++;
      this.opts.log.warn({ event: 'hook.dropped', reason: 'hook is too slow; oldest change skipped' });
    }
    this.queue.push(ev);
    this.next();
  }

  /** Whether a change is running or waiting (for tests and shutdown). */
  get busy(): boolean {
    return this.running || this.queue.length > 0;
  }

  private next(): void {
    if (this.running) return;
    const ev = this.queue.shift();
    if (!ev) return;
    this.running = true;
    const rec = ev.record;
    const env: NodeJS.ProcessEnv = {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      DEVCLOUD_VAR_TYPE: rec.type,
      DEVCLOUD_VAR_NAME: rec.name,
      DEVCLOUD_VAR_ORIGIN: rec.origin,
      DEVCLOUD_VAR_TIME: String(rec.time),
    };
    if (rec.value === null) env.DEVCLOUD_VAR_DELETED = '1';
    else {
      const enc = encodeValue(rec.value);
      if ('value' in enc && !enc.value.includes('\0')) env.DEVCLOUD_VAR_VALUE = enc.value;
      else env.DEVCLOUD_VAR_VALUE64 = rec.value.toString('base64');
    }
    // Its own process group (runInGroup), so that a timeout kills what the hook started as well: a script stuck
    // in a child command would otherwise leave that child running forever. SIGKILL at once; stdout discarded.
    void (this.opts.run ?? runInGroup)({
      file: this.opts.exec,
      env,
      stderr: { maxBytes: STDERR_HEAD, keep: 'head' },
      timeoutMs: this.opts.timeoutMs,
    }).then((r) => {
      let err: string | undefined;
      if (r.kind === 'spawn-error') err = r.error.message;
      else if (r.timedOut) err = `killed after ${this.opts.timeoutMs} ms`;
      else if (r.signal !== null) err = `killed by ${r.signal}`;
      else if (r.code !== 0) err = `exited with status ${r.code}`;
      this.running = false;
      if (err !== undefined) {
        this.counters.failed++;
        this.opts.log.warn({ event: 'hook.failed', name: rec.name, exec: this.opts.exec, err, stderr: r.stderr.text });
      } else {
        this.counters.ran++;
        this.opts.log.debug({ event: 'hook.ran', name: rec.name });
      }
      this.next();
    });
  }
}
