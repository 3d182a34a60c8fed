/**
 * The interpreter of the firmware state machine (`machine.ts`, docs/decisions.md §7): it runs the side effect of the
 * saved state, feeds the outcome to the transition function, saves the next state (durably, before its side
 * effect runs), and reports every transition as the `meta` variables `fwstate`, `fwprogress`, `fwname`,
 * `fwerror`, `fwerrorcode` and `fwversion`. On start it resumes from the saved state; the loop counter
 * (`attempts`) turns a crash loop into `failed` before the switch and into a rollback after it.
 */
import { readlinkSync } from 'node:fs';
import { mkdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from '../../lib/log.js';
import { type RunInGroup, runInGroup } from '../../lib/process.js';
import type { Db } from '../../lib/sqlite.js';
import { type FwFailureCode, type FwMessage, type MetaMessage, messageId } from '../../protocol/index.js';
import type { AgentConfig } from '../config.js';
import { DEFAULT_RETRY, type RetryPolicy, downloadWithRetry, isDownloadError } from './download.js';
import { healthCheck } from './health.js';
import {
  type ActiveState,
  type Failure,
  type FwEvent,
  type FwState,
  afterSwitch,
  isActive,
  isFinal,
  transition,
} from './machine.js';
import {
  type BackgroundListing,
  PROGRAM_STDERR,
  type SlotName,
  activeSlot,
  describeExit,
  installImage,
  isInstallError,
  listInBackground,
  restoreSlot,
  switchSlot,
} from './slots.js';
import { type FwJob, FwJobStore } from './store.js';
import { type VerifyFailure, loadPublicKeys, verifyImage } from './verify.js';

export type FirmwareConfig = AgentConfig['firmware'] & { slotsDir: string };

export interface FwReporter {
  publish(payload: MetaMessage, onAck: () => void): boolean;
  readonly connected: boolean;
}

export interface UpdaterOptions {
  db: Db;
  config: FirmwareConfig;
  /** Where images are downloaded to (`<stateDir>/fw`). */
  imageDir: string;
  /** The version the agent reports while no update has been committed (`fwVersion`). */
  baseVersion: string;
  /** The command that reboots the gateway (`commands.rebootCommand`). */
  rebootCommand: readonly string[];
  reporter: FwReporter;
  /** The `agent` restart: stop and exit so that the service manager starts the agent again. */
  restartAgent: () => void;
  log: Logger;
  now: () => number;
  retry?: RetryPolicy;
  /** What runs the installers, the restart and health commands and `tar`; `runInGroup` when not given. */
  run?: RunInGroup;
}

/** The updater of an agent's state directory and config, as the agent and the offline `fw` commands build it. */
export function updaterFor(
  config: AgentConfig,
  deps: Pick<UpdaterOptions, 'db' | 'reporter' | 'restartAgent' | 'log' | 'now' | 'run'>,
): FirmwareUpdater {
  const fw = config.firmware;
  return new FirmwareUpdater({
    ...deps,
    config: { ...fw, slotsDir: fw.slotsDir ?? join(config.stateDir, 'slots') },
    imageDir: join(config.stateDir, 'fw'),
    baseVersion: config.fwVersion,
    rebootCommand: config.commands.rebootCommand,
    ...(fw.downloadRetryDelayMs === undefined
      ? {}
      : { retry: { ...DEFAULT_RETRY, baseDelayMs: fw.downloadRetryDelayMs } }),
  });
}

/** What a state's work came to. `wait`: a restart is under way; this process does nothing more for the job. */
type Outcome = FwEvent | { type: 'wait' } | { type: 'stopped' };

/** A failed step: `fwerror` says what happened, `fwerrorcode` names it (docs/firmware.md, "Failure codes"). */
const fail = (code: FwFailureCode, error: string): Extract<FwEvent, { type: 'fail' }> => ({
  type: 'fail',
  code,
  error,
});

/** The programs a step runs: the restart or reboot, and the command installer's actions. */
type Step = 'restart' | 'reboot' | 'install' | 'switch' | 'commit' | 'rollback';

/** The code of each reason the verification gives. */
const VERIFY_CODE: { readonly [R in VerifyFailure]: FwFailureCode } = {
  size: 'verify-size',
  sha256: 'verify-sha256',
  signature: 'signature',
  'no-keys': 'no-keys',
  unreadable: 'image-unreadable',
};

/** The code of a failure no step foresaw (an exception out of a state's work): the step's own. */
const STEP_CODE: { readonly [S in ActiveState]: FwFailureCode } = {
  downloading: 'download',
  verifying: 'verify',
  installing: 'install',
  switching: 'switch',
  restarting: 'restart',
  committing: 'commit',
  rollingback: 'rollback',
};

/** The longest `fwerror` reported; the whole error goes to the log. */
const MAX_ERROR = 1000;
/** Progress is reported at most this often while downloading. */
const PROGRESS_EVERY_MS = 1000;
/** Transitions kept while offline; a bound, though one job makes only a handful. */
const MAX_UNSENT = 100;

export class FirmwareUpdater {
  readonly store: FwJobStore;
  private driving = false;
  private stopped = false;
  /** Stops the running side effect (download, health check) when a cancel, commit or rollback overtakes it. */
  private effect: AbortController | undefined;
  private lastProgress = { pct: -1, at: 0 };
  /**
   * Reports made while offline, oldest first, sent on connect: a resumed job often moves on before the agent
   * has connected, and the cloud must see every transition, not only the last one.
   */
  private unsent: Array<{ payload: MetaMessage; onAck: () => void }> = [];
  /**
   * The image's member listing (slots installer), made by `tar -tv` while the image is verified: the install
   * checks it before it unpacks, and the listing then costs no time of its own.
   */
  private listing: { job: string; listing: BackgroundListing } | undefined;
  /** The slots of the install that just finished; saved with the move to `switching`. */
  private installed: { job: string; from: SlotName; to: SlotName } | undefined;

  private readonly runProcess: RunInGroup;

  constructor(private readonly o: UpdaterOptions) {
    this.store = new FwJobStore(o.db);
    this.runProcess = o.run ?? runInGroup;
  }

  /** The version the gateway runs: the latest committed image's, or the configured one before any update. */
  version(): string {
    const v = this.store.committedVersion();
    return v === undefined ? this.o.baseVersion : String(v);
  }

  /** At start: resume the saved job, or finish the restart a final state left pending. */
  async start(): Promise<void> {
    const job = this.store.latest();
    if (!job) return;
    if (isActive(job.state)) {
      const attempts = job.attempts + 1;
      this.store.patch(job.id, { attempts });
      this.o.log.info({ event: 'fw.resume', job: job.id, state: job.state, attempt: attempts });
      const restarted = job.restartPending && (this.o.config.restart === 'agent' || this.o.config.restart === 'reboot');
      this.apply(this.store.byId(job.id)!, {
        type: 'resume',
        attempts,
        maxAttempts: this.o.config.maxAttempts,
        restarted,
      });
    } else if (job.restartPending) {
      await this.finishRestart(job, true);
    }
    this.kick();
  }

  /** Stops the running side effect without a transition: the saved state is resumed at the next start. */
  stop(): void {
    this.stopped = true;
    this.effect?.abort();
    this.listing?.listing.abort();
    this.listing = undefined;
  }

  onConnected(): void {
    const unsent = this.unsent.splice(0);
    for (const u of unsent) this.o.reporter.publish(u.payload, u.onAck);
    // The last unsent report is the job's latest state; without one, a report from before a restart may be due.
    const job = this.store.latest();
    if (job && !job.reported && unsent.length === 0) this.report(job);
  }

  /** `down/fw` from the cloud. */
  onMessage(msg: FwMessage): void {
    if (msg.action === 'cancel') {
      this.cancel(msg.job);
      return;
    }
    const known = this.store.byId(msg.job);
    if (known) {
      // The cloud sends an open job again on every hello, with a new token: a download still to come needs it,
      // and the state it asks about is reported again (the report may have been lost with the connection).
      this.o.log.debug({ event: 'fw.duplicate', job: msg.job, state: known.state });
      if (known.token !== null) this.store.refreshToken(known.id, msg.token, msg.url);
      this.report(known);
      return;
    }
    const current = this.store.latest();
    if (current && isActive(current.state)) {
      if (afterSwitch(current.state)) {
        this.o.log.warn({ event: 'fw.busy', job: msg.job, running: current.id, state: current.state });
        return;
      }
      // The cloud has given up on the job in hand (it sends one job at a time): the new one replaces it.
      this.effect?.abort();
      this.moveTo(current, 'cancelled', { error: `replaced by job ${msg.job}`, code: 'replaced' });
    }
    const job = this.store.add(
      {
        id: msg.job,
        name: msg.name,
        version: msg.version,
        platform: msg.platform,
        url: msg.url,
        token: msg.token,
        size: msg.size,
        sha256: msg.sha256,
        signature: msg.signature,
      },
      'downloading',
      this.o.now(),
    );
    this.o.log.info({
      event: 'fw.job',
      job: job.id,
      name: job.name,
      version: job.version,
      size: job.size,
      from: this.version(),
    });
    this.store.prune(this.o.config.keepJobs);
    this.report(job);
    this.kick();
  }

  /** `DELETE …/fw`: honoured before the switch, refused (logged) after it. */
  cancel(jobId: string): { ok: boolean; why?: string } {
    const job = this.store.byId(jobId);
    const latest = this.store.latest();
    if (!job || job.id !== latest?.id) {
      this.o.log.info({ event: 'fw.cancel_ignored', job: jobId, reason: 'not the job in hand' });
      return { ok: false, why: 'not the job in hand' };
    }
    const t = transition(job.state, { type: 'cancel' });
    if (t.kind === 'refused') {
      this.o.log.warn({ event: 'fw.cancel_refused', job: jobId, state: job.state, reason: t.why });
      return { ok: false, why: t.why };
    }
    // Kept first, so that a restart before the cancel is acted on still honours it.
    this.store.askCancel(job.id);
    this.effect?.abort();
    this.kick();
    return { ok: true };
  }

  /** `devcloud-agent fw commit`. */
  commit(): { ok: boolean; why?: string; state?: FwState } {
    return this.byHand({ type: 'commit' });
  }

  /** `devcloud-agent fw rollback`. */
  rollback(reason = 'rolled back by hand'): { ok: boolean; why?: string; state?: FwState } {
    return this.byHand({ type: 'rollback', reason });
  }

  /** Waits until no side effect runs (what a one-shot `fw rollback` without an agent needs). */
  async settled(): Promise<FwJob | undefined> {
    while (this.driving) await new Promise((r) => setTimeout(r, 10));
    return this.store.latest();
  }

  status(): Record<string, unknown> {
    const job = this.store.latest();
    return {
      state: job?.state ?? 'idle',
      version: this.version(),
      installer: this.o.config.installer,
      restart: this.o.config.restart,
      job: job
        ? {
            id: job.id,
            name: job.name,
            version: job.version,
            size: job.size,
            progress: job.progress,
            error: job.error,
            errorCode: job.errorCode,
            attempts: job.attempts,
            received: job.receivedAt,
            stateAt: job.stateAt,
            fromSlot: job.fromSlot,
            toSlot: job.toSlot,
            switchedAt: job.switchedAt,
            restartPending: job.restartPending,
            reported: job.reported,
            steps: this.store.steps(job.id),
          }
        : null,
      slotsDir: this.o.config.installer === 'slots' ? this.o.config.slotsDir : null,
      activeSlot: this.o.config.installer === 'slots' ? readActiveSlot(this.o.config.slotsDir) : null,
    };
  }

  private byHand(event: Extract<FwEvent, { type: 'commit' | 'rollback' }>): {
    ok: boolean;
    why?: string;
    state?: FwState;
  } {
    const job = this.store.latest();
    if (!job) return { ok: false, why: 'this gateway has had no firmware update' };
    const t = transition(job.state, event);
    if (t.kind === 'refused') return { ok: false, why: t.why };
    this.o.log.warn({ event: `fw.${event.type}_by_hand`, job: job.id, state: job.state });
    this.effect?.abort();
    const moved = this.apply(job, event);
    this.kick();
    return { ok: true, state: moved.state };
  }

  /** Applies an event to the saved job and saves the outcome. */
  private apply(job: FwJob, event: FwEvent): FwJob {
    const t = transition(job.state, event);
    switch (t.kind) {
      case 'refused':
        throw new Error(`firmware: ${event.type} refused in ${job.state}: ${t.why}`);
      case 'stay': {
        if (t.failure === undefined) return job;
        const { error, code } = t.failure;
        // The saved error stays the reason for the rollback (what `rolledback` reports in the end); the failure
        // of the rollback itself is reported beside it while the job waits, with its code, and kept in the job's
        // steps.
        this.o.log.error({ event: 'fw.stuck', job: job.id, state: job.state, error, code });
        this.store.noteStep(job.id, job.state, this.o.now(), { error: clip(error), code });
        const shown = clip(job.error === '' ? error : `${job.error}; then ${error}`);
        this.report({ ...job, error: shown, errorCode: code });
        return job;
      }
      case 'move':
        return this.moveTo(job, t.to, t.failure);
    }
  }

  /** Saves a transition, logs it, reports it. Entering a state records what its side effect will need. */
  private moveTo(job: FwJob, to: FwState, failure?: Failure): FwJob {
    const now = this.o.now();
    const patch: Parameters<FwJobStore['move']>[3] = {};
    if (failure !== undefined) patch.failure = { error: clip(failure.error), code: failure.code };
    // The loop counter counts the starts of one stretch: the switch begins the second.
    if (to === 'switching' && job.state !== 'switching') {
      patch.attempts = 1;
      patch.switchedAt = now;
      // Where the image went and what ran before: saved before the switch, so a rollback knows where to return.
      if (this.installed?.job === job.id) {
        patch.fromSlot = this.installed.from;
        patch.toSlot = this.installed.to;
      }
      this.installed = undefined;
    }
    if (to === 'restarting' && job.state !== 'restarting') patch.restartPending = true;
    if (to === 'committing') patch.restartPending = false;
    if (to === 'rolledback' && this.o.config.restart !== 'none') patch.restartPending = true;
    if (to === 'done') patch.progress = 100;
    if (isFinal(to)) patch.token = null;
    const moved = this.store.move(job.id, to, now, patch);
    const line = { event: 'fw.state', job: job.id, from: job.state, to, name: job.name, version: job.version };
    if (to === 'failed' || to === 'rolledback' || to === 'rollingback') {
      this.o.log.error({ ...line, error: moved.error, code: moved.errorCode });
    } else if (to === 'cancelled') {
      this.o.log.warn({ ...line, error: moved.error, code: moved.errorCode });
    } else {
      this.o.log.info(line);
    }
    this.report(moved);
    if (isFinal(to)) void this.cleanUp(moved);
    return moved;
  }

  private report(job: FwJob): void {
    const meta = {
      fwstate: job.state,
      fwprogress: String(job.progress),
      fwname: job.name,
      fwerror: job.error,
      fwerrorcode: job.errorCode,
      fwversion: this.version(),
    };
    const { id, state, stateAt } = job;
    const payload = { id: messageId(), ts: this.o.now(), meta };
    const onAck = (): void => {
      if (!this.stopped) this.store.markReported(id, state, stateAt);
    };
    if (this.o.reporter.publish(payload, onAck)) return;
    this.unsent.push({ payload, onAck });
    if (this.unsent.length > MAX_UNSENT) this.unsent.shift();
  }

  private reportProgress(job: FwJob, bytes: number): void {
    const pct = job.size === 0 ? 100 : Math.floor((bytes * 100) / job.size);
    const now = this.o.now();
    if (pct === this.lastProgress.pct) return;
    if (pct !== 100 && now - this.lastProgress.at < PROGRESS_EVERY_MS) return;
    this.lastProgress = { pct, at: now };
    this.store.patch(job.id, { progress: pct });
    this.o.log.debug({ event: 'fw.progress', job: job.id, progress: pct, bytes });
    this.o.reporter.publish({ id: messageId(), ts: now, meta: { fwprogress: String(pct) } }, () => undefined);
  }

  /** Runs the machine until the job waits, ends, or the agent stops. One driver at a time. */
  private kick(): void {
    if (this.driving || this.stopped) return;
    this.driving = true;
    void this.drive()
      .catch((err: unknown) => {
        this.o.log.error({ event: 'fw.driver_failed', err: String(err) });
      })
      .finally(() => {
        this.driving = false;
      });
  }

  private async drive(): Promise<void> {
    for (;;) {
      if (this.stopped) return;
      const job = this.store.latest();
      if (!job || !isActive(job.state)) return;
      if (job.cancelAsked && !afterSwitch(job.state)) {
        this.apply(job, { type: 'cancel' });
        continue;
      }
      const outcome = await this.run(job, job.state);
      if (this.stopped || outcome.type === 'wait') return;
      // The work was stopped because a cancel, commit or rollback moved the job: carry on from where it is now.
      if (outcome.type === 'stopped') continue;
      const now = this.store.latest();
      // A cancel, commit or rollback moved the job while its work ran: the work's outcome no longer applies.
      if (!now || now.id !== job.id || now.state !== job.state || now.stateAt !== job.stateAt) continue;
      if (now.cancelAsked && !afterSwitch(now.state)) {
        this.apply(now, { type: 'cancel' });
        continue;
      }
      if (outcome.type === 'fail') {
        this.o.log.warn({
          event: 'fw.step_failed',
          job: job.id,
          state: job.state,
          error: outcome.error,
          code: outcome.code,
        });
      }
      const after = this.apply(now, outcome);
      if (after.state === job.state && after.stateAt === now.stateAt) return;
      // Entering a final state that asks for a restart (after a rollback): do it now.
      if (isFinal(after.state) && after.restartPending) {
        await this.finishRestart(after, false);
        return;
      }
    }
  }

  /** The side effect of each state. Never throws: a failure comes back as a `fail` outcome. */
  private async run(job: FwJob, state: ActiveState): Promise<Outcome> {
    const ctl = new AbortController();
    this.effect = ctl;
    try {
      switch (state) {
        case 'downloading':
          return await this.download(job, ctl.signal);
        case 'verifying':
          return await this.verify(job);
        case 'installing':
          return await this.install(job);
        case 'switching':
          return await this.switchSlots(job);
        case 'restarting':
          return await this.restart(job);
        case 'committing':
          return await this.healthAndCommit(job, ctl.signal);
        case 'rollingback':
          return await this.rollBack(job);
        default: {
          const none: never = state;
          throw new Error(`no work for state ${String(none)}`);
        }
      }
    } catch (err) {
      if (this.stopped) return { type: 'stopped' };
      return fail(STEP_CODE[state], `${state}: ${err instanceof Error ? err.message : String(err)}`);
    } finally {
      if (this.effect === ctl) this.effect = undefined;
    }
  }

  private imagePath(job: FwJob): string {
    return join(this.o.imageDir, `${job.id}.part`);
  }

  private async download(job: FwJob, signal: AbortSignal): Promise<Outcome> {
    if (!/^https?:$/.test(safeProtocol(job.url))) {
      return fail('download', `download: the image URL is not an http or https URL`);
    }
    if (job.token === null) return fail('download', 'download: the job has no download token');
    await mkdir(this.o.imageDir, { recursive: true, mode: 0o700 });
    this.lastProgress = { pct: job.progress, at: 0 };
    try {
      const r = await downloadWithRetry(
        {
          url: job.url,
          token: job.token,
          dest: this.imagePath(job),
          size: job.size,
          signal,
          onProgress: (bytes) => this.reportProgress(job, bytes),
        },
        this.o.retry ?? DEFAULT_RETRY,
        (err, attempt, waitMs) =>
          this.o.log.warn({ event: 'fw.download_retry', job: job.id, attempt, waitMs, error: err.message }),
      );
      this.o.log.info({ event: 'fw.downloaded', job: job.id, bytes: r.bytes, resumedFrom: r.resumedFrom });
      return { type: 'ok' };
    } catch (err) {
      if (this.stopped) return { type: 'stopped' };
      // The job came again with a new token while this attempt used one the bridge no longer takes: try again.
      if (isDownloadError(err) && err.status === 401 && this.store.byId(job.id)?.token !== job.token) {
        this.o.log.info({ event: 'fw.token_renewed', job: job.id });
        return { type: 'stopped' };
      }
      const detail = isDownloadError(err) ? err.message : String(err);
      const denied = isDownloadError(err) && (err.status === 401 || err.status === 403);
      return fail(denied ? 'download-denied' : 'download', `download: ${detail}`);
    }
  }

  private async verify(job: FwJob): Promise<Outcome> {
    let keys: string[];
    try {
      keys = await loadPublicKeys(this.o.config.publicKeys);
    } catch (err) {
      return fail('bad-key', `verify: ${(err as Error).message}`);
    }
    const identity = {
      name: job.name,
      platform: job.platform,
      version: job.version,
      size: job.size,
      sha256: job.sha256,
    };
    // The slots installer's member listing runs beside the hashing; it only reads the file, and its result is
    // used only once the image has verified.
    if (this.o.config.installer === 'slots') {
      this.listing?.listing.abort();
      this.listing = {
        job: job.id,
        listing: listInBackground(this.imagePath(job), {
          timeoutMs: this.o.config.installTimeoutMs,
          run: this.runProcess,
        }),
      };
    }
    const r = await verifyImage(this.imagePath(job), identity, job.signature, keys);
    if (!r.ok) {
      this.listing?.listing.abort();
      this.listing = undefined;
      return fail(VERIFY_CODE[r.reason], `verify (${r.reason}): ${r.detail}`);
    }
    this.o.log.info({ event: 'fw.verified', job: job.id, key: this.o.config.publicKeys[r.keyIndex] });
    return { type: 'ok' };
  }

  /** The listing started beside the verification, if it is this job's; `undefined` otherwise. */
  private async backgroundListing(job: FwJob): Promise<string | undefined> {
    const l = this.listing;
    this.listing = undefined;
    if (!l) return undefined;
    if (l.job !== job.id) {
      l.listing.abort();
      return undefined;
    }
    try {
      return await l.listing.finish();
    } catch {
      // Listed again by the install, which reports the failure in full.
      return undefined;
    }
  }

  private async install(job: FwJob): Promise<Outcome> {
    const cfg = this.o.config;
    if (cfg.installer === 'command') {
      const r = await this.installer(job, 'install');
      return r ?? { type: 'ok' };
    }
    try {
      const from = await activeSlot(cfg.slotsDir);
      const listing = await this.backgroundListing(job);
      const r = await installImage(cfg.slotsDir, this.imagePath(job), {
        ...(listing === undefined ? {} : { listing }),
        scriptTimeoutMs: cfg.installTimeoutMs,
        tarTimeoutMs: cfg.installTimeoutMs,
        maxBytes: cfg.maxUnpackedBytes,
        maxFiles: cfg.maxFiles,
        env: this.jobEnv(job),
        run: this.runProcess,
      });
      this.o.log.info({
        event: 'fw.installed',
        job: job.id,
        slot: r.slot,
        active: from,
        manifest: r.manifest.name,
        // Whether the members were listed beside the verification, or by a tar run of their own.
        listedEarly: listing !== undefined,
      });
      // The slots ride along with the next transition, saved before the switch touches anything.
      this.installed = { job: job.id, from, to: r.slot };
      return { type: 'ok' };
    } catch (err) {
      const code = isInstallError(err) ? err.code : 'io';
      return fail(code === 'io' ? 'install' : code, `install (${code}): ${(err as Error).message}`);
    }
  }

  private async switchSlots(job: FwJob): Promise<Outcome> {
    if (this.o.config.installer === 'command') return (await this.installer(job, 'switch')) ?? { type: 'ok' };
    if (job.toSlot === null) return fail('switch', 'switch: the slot the image was installed into is unknown');
    await switchSlot(this.o.config.slotsDir, job.toSlot);
    this.o.log.info({ event: 'fw.switched', job: job.id, active: job.toSlot, previous: job.fromSlot });
    return { type: 'ok' };
  }

  private async restart(job: FwJob): Promise<Outcome> {
    const fail = await this.restartNow(job);
    if (fail === 'wait') return { type: 'wait' };
    return fail ?? { type: 'ok' };
  }

  /**
   * Runs the configured restart. `wait`: this process is going away (the agent's own restart) or the gateway
   * is rebooting; the saved state carries the update on in the next process.
   */
  private async restartNow(job: FwJob): Promise<FwEvent | 'wait' | undefined> {
    const cfg = this.o.config;
    switch (cfg.restart) {
      case 'none':
        return undefined;
      case 'command': {
        const r = await this.runStep(job, cfg.restartCommand!, 'restart');
        return r;
      }
      case 'agent':
        this.o.log.warn({ event: 'fw.restart_agent', job: job.id, state: job.state });
        this.o.restartAgent();
        return 'wait';
      case 'reboot': {
        this.o.log.warn({ event: 'fw.reboot', job: job.id, state: job.state });
        const r = await this.runStep(job, this.o.rebootCommand, 'reboot');
        return r ?? 'wait';
      }
    }
  }

  /** After a final state that asked for a restart (a rollback): restart, then clear the request. */
  private async finishRestart(job: FwJob, atStart: boolean): Promise<void> {
    const kind = this.o.config.restart;
    if (atStart && (kind === 'agent' || kind === 'reboot' || kind === 'none')) {
      // This process is the restart.
      this.store.patch(job.id, { restartPending: false });
      return;
    }
    const r = await this.restartNow(job);
    if (r === 'wait' || this.stopped) return;
    if (r !== undefined && r.type === 'fail') {
      this.o.log.error({ event: 'fw.restart_failed', job: job.id, state: job.state, error: r.error });
    }
    this.store.patch(job.id, { restartPending: false });
  }

  private async healthAndCommit(job: FwJob, signal: AbortSignal): Promise<Outcome> {
    const cfg = this.o.config;
    const h = cfg.health;
    const deadline = (job.switchedAt ?? job.stateAt) + h.commitTimeoutMs;
    const left = deadline - this.o.now();
    if (left <= 0) return fail('health', `commit: not found healthy within ${h.commitTimeoutMs} ms of the switch`);
    if (h.command !== undefined || h.url !== undefined) {
      const ctl = new AbortController();
      const timer = setTimeout(() => ctl.abort(), left);
      const onAbort = (): void => ctl.abort();
      signal.addEventListener('abort', onAbort, { once: true });
      const timing = {
        timeoutMs: h.timeoutMs,
        retries: h.retries,
        intervalMs: h.intervalMs,
        signal: ctl.signal,
        run: this.runProcess,
      };
      this.o.log.info({ event: 'fw.health_check', job: job.id, check: h.command?.join(' ') ?? h.url });
      try {
        const r = await healthCheck(
          h.command !== undefined ? { ...timing, command: h.command } : { ...timing, url: h.url! },
        );
        if (signal.aborted) return { type: 'stopped' };
        if (!r.healthy) {
          const why = r.aborted ? `health check: not healthy within ${h.commitTimeoutMs} ms of the switch` : r.reason;
          return fail('health', why);
        }
        this.o.log.info({ event: 'fw.healthy', job: job.id, attempts: r.attempts });
      } finally {
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
      }
    }
    if (cfg.installer === 'command') {
      const r = await this.installer(job, 'commit');
      if (r) return r;
    }
    return { type: 'ok' };
  }

  private async rollBack(job: FwJob): Promise<Outcome> {
    const cfg = this.o.config;
    if (cfg.installer === 'command') return (await this.installer(job, 'rollback')) ?? { type: 'ok' };
    if (job.fromSlot === null) return fail('rollback', 'rollback: the slot that ran before is unknown');
    await restoreSlot(cfg.slotsDir, job.fromSlot);
    this.o.log.warn({ event: 'fw.rolled_back', job: job.id, active: job.fromSlot });
    return { type: 'ok' };
  }

  /** The command installer: `installCommand <action> [image]`, with the job in the environment. */
  private installer(job: FwJob, action: 'install' | 'switch' | 'commit' | 'rollback'): Promise<FwEvent | undefined> {
    const argv = [...this.o.config.installCommand!, action, ...(action === 'install' ? [this.imagePath(job)] : [])];
    return this.runStep(job, argv, action);
  }

  /** Runs a program of a step; `undefined` when it exits 0, a `fail` event otherwise. */
  private async runStep(job: FwJob, argv: readonly string[], step: Step): Promise<FwEvent | undefined> {
    // A reboot is the restart of `firmware.restart: reboot`.
    const code = step === 'reboot' ? 'restart' : step;
    const [file, ...args] = argv;
    this.o.log.info({ event: 'fw.exec', job: job.id, step, command: argv.join(' ') });
    // In its own process group (runInGroup): the timeout kills what it started too. Its stdout is discarded.
    const r = await this.runProcess({
      file: file!,
      args,
      env: { ...process.env, ...this.jobEnv(job) },
      stderr: PROGRAM_STDERR,
      timeoutMs: this.o.config.installTimeoutMs,
    });
    if (r.kind === 'spawn-error') return fail(code, `${step}: cannot run ${file}: ${r.error.message}`);
    if (r.timedOut) return fail(code, `${step}: ${file} ran longer than ${this.o.config.installTimeoutMs} ms`);
    if (r.code !== 0) return fail(code, `${step}: ${file} failed (${describeExit(r)})`);
    return undefined;
  }

  private jobEnv(job: FwJob): Record<string, string> {
    return {
      DEVCLOUD_FW_JOB: job.id,
      DEVCLOUD_FW_NAME: job.name,
      DEVCLOUD_FW_VERSION: String(job.version),
      DEVCLOUD_FW_IMAGE: this.imagePath(job),
    };
  }

  private async cleanUp(job: FwJob): Promise<void> {
    if (this.listing?.job === job.id) {
      this.listing.listing.abort();
      this.listing = undefined;
    }
    try {
      await rm(this.imagePath(job), { force: true });
    } catch (err) {
      this.o.log.warn({ event: 'fw.cleanup_failed', job: job.id, err: String(err) });
    }
  }
}

/** The target of `current` (`a` when there is none yet), read without waiting: status is synchronous. */
function readActiveSlot(dir: string): string {
  try {
    return readlinkSync(join(dir, 'current'));
  } catch {
    return 'a';
  }
}

function safeProtocol(url: string): string {
  try {
    return new URL(url).protocol;
  } catch {
    return '';
  }
}

function clip(s: string): string {
  return s.length <= MAX_ERROR ? s : `${s.slice(0, MAX_ERROR - 1)}…`;
}
