/**
 * The agent's controller: it owns start and stop, wires the parts together, and runs the modes of
 * decision 21.
 *
 * - `master` (default): persistent uplink, and the nearby listener on UDP 590.
 * - `connected`: persistent uplink, no listener (what a firmware update needs).
 * - `deadleaf`: wakes every `d` variable `deadleaf` seconds (default 300), syncs, and sleeps; while asleep the
 *   retained `state` is `sleeping`.
 */
import { join } from 'node:path';
import { type Logger, type LogLevel, recentProblems } from '../lib/log.js';
import { type RunInGroup, runInGroup } from '../lib/process.js';
import { type Db, GroupCommitter, freeBytes, openDatabase } from '../lib/sqlite.js';
import { safeUrl } from '../lib/url.js';
import { VERSION } from '../lib/version.js';
import { type HelloMessage, Mode, messageId } from '../protocol/index.js';
import { CloudClock, bootId, monotonicMs } from './clock.js';
import { type AgentConfig, socketPath } from './config.js';
import { CommandQueue, type Outcome, type QueuedCommand } from './commands/queue.js';
import { CommandRunner } from './commands/runner.js';
import { type FirmwareUpdater, updaterFor } from './fw/updater.js';
import { type Identity, loadIdentity } from './identity.js';
import { IdleCollector } from './idle-gc.js';
import { AGENT_DB_OPTIONS, AGENT_MIGRATIONS } from './migrations.js';
import type { CommandJson, QueueJson } from './local/messages.js';
import { LocalServer } from './local/server.js';
import { NearbyListener } from './nearby/listener.js';
import { HeardReporter } from './nearby/reporter.js';
import { MetaReporter } from './report.js';
import { type DownMessage, Uplink } from './uplink.js';
import { ChangeHook } from './vars/hooks.js';
import { nextGeneration } from './vars/generation.js';
import { VarStore } from './vars/store.js';
import { type ChangeEvent, VarSync } from './vars/sync.js';

export type AgentMode = Mode;
/**
 * SQLite's page cache for the agent's connection, KiB. better-sqlite3 builds SQLite with 16 MB, which a burst of
 * changes fills and malloc never gives back; the agent's working set (the inner pages of the variables' and the
 * queue's B-trees) fits in far less, and the kernel's page cache holds the rest (docs/agent.md, memory).
 */
export const AGENT_CACHE_KIB = 512;
export const DEFAULT_DEADLEAF_SEC = 300;
/** The shortest deadleaf period accepted; smaller values would keep the radio on anyway. */
export const MIN_DEADLEAF_SEC = 5;

export interface AgentDeps {
  config: AgentConfig;
  log: Logger;
  env?: NodeJS.ProcessEnv;
  /** The gateway's own clock (`Date.now`); the agent corrects it by the cloud's (decision 24, agent/clock.ts). */
  now?: () => number;
  /** The monotonic clock (`monotonicMs`) and the boot id (`bootId()`), for tests. */
  monotonic?: () => number;
  bootId?: string | undefined;
  /**
   * What the `restart` command does once the agent has stopped: by default the process exits with status 75, and
   * its service manager starts it again.
   */
  onRestart?: () => void;
  /**
   * What runs every child process the agent waits on (handlers, the change hook, the reboot command, the
   * firmware's installers and checks); `runInGroup` when not given, for tests.
   */
  run?: RunInGroup;
}

/** The exit status of a restart asked for by the `restart` command (EX_TEMPFAIL: "try again"). */
export const RESTART_EXIT_CODE = 75;

export class Agent {
  readonly identity: Identity;
  readonly vars: VarSync;
  readonly uplink: Uplink;
  readonly nearby: NearbyListener;
  readonly local: LocalServer;
  readonly commands: CommandRunner;
  readonly queue: CommandQueue;
  readonly firmware: FirmwareUpdater;
  /** The cloud's clock as the agent knows it: what every part stamps and judges time by. */
  readonly clock: CloudClock;
  private readonly db: Db;
  private readonly commit: GroupCommitter;
  private readonly reporter: HeardReporter;
  private readonly hook: ChangeHook | undefined;
  private readonly report: MetaReporter;
  private readonly idleGc: IdleCollector;
  private readonly startedAt: number;
  /** Monotonic time at start: uptime must not jump when the clock is corrected. */
  private readonly startedMono: number;
  /** The time every part uses: {@link clock}'s `now`. */
  private readonly now: () => number;
  private mode: AgentMode = 'master';
  private asleep = false;
  private wakeTimer: NodeJS.Timeout | undefined;
  private settleTimer: NodeJS.Timeout | undefined;
  private awakeSince = 0;
  private lastActivity = 0;
  private stopped = false;

  private constructor(
    private readonly config: AgentConfig,
    private readonly log: Logger,
    private readonly ownNow: () => number,
    monotonic: () => number,
    boot: string | undefined,
    env: NodeJS.ProcessEnv,
    private readonly onRestart: () => void,
    private readonly run: RunInGroup,
  ) {
    const { identity, source } = loadIdentity(config.stateDir, config.identity.provisioningFile);
    this.identity = identity;
    log.setBindings({ deviceId: identity.deviceId });
    log.info({ event: 'agent.identity', source, stateDir: config.stateDir });

    this.db = openDatabase(join(config.stateDir, 'agent.db'), AGENT_MIGRATIONS, {
      ...AGENT_DB_OPTIONS,
      // Once per gateway, and it holds up that start: said, so that a slow start has its reason in the journal.
      onConverted: (info) => log.info({ event: 'store.converted', ...info }),
    });
    this.db.pragma(`cache_size = -${AGENT_CACHE_KIB}`);
    this.commit = new GroupCommitter(this.db, {
      onStorageChange: (full, err) => {
        if (full) log.error({ event: 'storage.full', stateDir: config.stateDir, err: String(err) });
        else log.info({ event: 'storage.recovered', stateDir: config.stateDir });
      },
    });
    this.clock = new CloudClock({ db: this.db, commit: this.commit, log, own: ownNow, monotonic, boot });
    const now = this.clock.now;
    this.now = now;
    this.startedAt = now();
    this.startedMono = this.clock.monotonic();
    const store = new VarStore(this.db, config.store.historyLimit, () => this.clock.verified);
    const generation = nextGeneration(this.db, config.stateDir);
    if (generation.fullSync) {
      log.warn({
        event: 'vars.restored',
        generation: generation.database,
        expected: generation.file ?? null,
        reason: 'the database is not the one this agent last ran with: everything is synced on the first connect',
      });
    }

    this.uplink = new Uplink({
      url: config.mqtt.url,
      deviceId: identity.deviceId,
      username: config.mqtt.username ?? identity.deviceId,
      password: config.mqtt.password ?? identity.secret,
      enrol:
        config.mqtt.enrolPassword === undefined
          ? undefined
          : { username: config.mqtt.enrolUsername ?? 'devcloud-enrol', password: config.mqtt.enrolPassword },
      keepaliveSec: config.mqtt.keepaliveSec,
      connectTimeoutMs: config.mqtt.connectTimeoutMs,
      backoffMinMs: config.mqtt.backoffMinMs,
      backoffMaxMs: config.mqtt.backoffMaxMs,
      backoffFastMaxMs: config.mqtt.backoffFastMaxMs,
      backoffFastForMs: config.mqtt.backoffFastForMs,
      healthyAfterMs: config.mqtt.healthyAfterMs,
      caFile: config.mqtt.caFile,
      certFile: config.mqtt.certFile,
      keyFile: config.mqtt.keyFile,
      rejectUnauthorized: config.mqtt.rejectUnauthorized,
      hello: () => this.hello(),
      log,
    });
    this.vars = new VarSync(store, this.commit, this.uplink, {
      batchSize: config.sync.batchSize,
      retryMs: config.sync.retryMs,
      maxValueBytes: config.store.maxValueBytes,
      now,
      monotonic: this.clock.monotonic,
      log,
      fullSyncOnStart: generation.fullSync,
    });
    this.queue = new CommandQueue(this.db);
    const cmd = config.commands;
    this.firmware = updaterFor(config, {
      db: this.db,
      reporter: this.uplink.reporter('up/meta'),
      restartAgent: () => {
        void this.stop().then(() => this.onRestart());
      },
      log,
      now,
      run,
    });
    this.commands = new CommandRunner({
      queue: this.queue,
      commit: this.commit,
      reporter: this.uplink.reporter('up/cmd'),
      actions: {
        identify: () => ({
          deviceId: identity.deviceId,
          platform: config.platform,
          fwVersion: this.firmware.version(),
          agentVersion: VERSION,
        }),
        reboot: () => this.reboot(),
        restart: () => {
          void this.stop().then(() => this.onRestart());
        },
        factoryReset: () => this.factoryReset(),
      },
      now,
      log,
      concurrency: cmd.concurrency,
      commandsDir: cmd.dir,
      timeoutMs: cmd.timeoutMs,
      outputBytes: cmd.outputBytes,
      allowFactoryReset: cmd.allowFactoryReset,
      allowReboot: cmd.allowReboot,
      env: { DEVCLOUD_DEVICE_ID: identity.deviceId },
      keepMs: cmd.keepDays * 86_400_000,
      run,
    });
    this.reporter = new HeardReporter(this.uplink, config.udp.maxAgeMs, now);
    this.report = new MetaReporter({
      intervalMs: config.report.intervalSec * 1000,
      reporter: this.uplink.reporter('up/meta'),
      figures: () => {
        const pending = this.vars.pending();
        return {
          uptime: Math.floor((this.clock.monotonic() - this.startedMono) / 1000),
          pending: pending.pushes + pending.syncs,
          queue: this.queue.counts().queued ?? 0,
          rss: process.memoryUsage.rss(),
        };
      },
      now,
      log,
    });
    // Idle means no variable traffic: the changes, acks and syncs counted by the sync engine.
    this.idleGc = new IdleCollector({
      activity: () => Object.values(this.vars.counters).reduce((a, b) => a + b, 0),
    });
    this.nearby = new NearbyListener({
      port: config.udp.port,
      ipv6: config.udp.ipv6,
      dedupeMs: config.udp.dedupeMs,
      now,
      monotonic: this.clock.monotonic,
      log,
      onHeard: (code, at) => this.reporter.heard(code, at),
    });
    this.local = new LocalServer(
      socketPath(config, env),
      parseInt(config.socket.mode, 8),
      {
        vars: this.vars,
        status: () => this.status(),
        queue: (recent: number) => this.queueView(recent),
        firmware: this.firmware,
        setLogLevel: (level: LogLevel) => {
          this.log.level = level;
        },
      },
      log,
    );
    if (config.hooks.change !== undefined) {
      this.hook = new ChangeHook({
        exec: config.hooks.change,
        origins: config.hooks.origins,
        timeoutMs: config.hooks.timeoutMs,
        log,
        run,
      });
    }
    this.wire();
  }

  /** Starts an agent; throws on what it cannot run without (identity, database, socket). */
  static async start(deps: AgentDeps): Promise<Agent> {
    const agent = new Agent(
      deps.config,
      deps.log,
      deps.now ?? Date.now,
      // A test that drives the clock drives intervals with it.
      deps.monotonic ?? deps.now ?? monotonicMs,
      'bootId' in deps ? deps.bootId : bootId(),
      deps.env ?? process.env,
      deps.onRestart ?? (() => process.exit(RESTART_EXIT_CODE)),
      deps.run ?? runInGroup,
    );
    try {
      await agent.local.start();
    } catch (err) {
      agent.db.close();
      throw err;
    }
    await agent.commands.start();
    await agent.firmware.start();
    agent.mode = agent.readMode();
    if (agent.mode === 'master') await agent.startNearby();
    deps.log.info({
      event: 'agent.started',
      version: VERSION,
      mode: agent.mode,
      broker: safeUrl(deps.config.mqtt.url),
      platform: deps.config.platform,
    });
    agent.wake();
    agent.idleGc.start();
    return agent;
  }

  /** Stops taking work, flushes, publishes `offline`, closes the database. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    this.log.info({ event: 'agent.stopping' });
    clearTimeout(this.wakeTimer);
    clearInterval(this.settleTimer);
    this.local.stopAccepting();
    this.nearby.stop();
    this.commands.stop();
    this.firmware.stop();
    this.report.stop();
    this.idleGc.stop();
    this.commit.flush();
    // Let the acknowledgements of what just committed go out before the connection closes.
    await new Promise((r) => setImmediate(r));
    await new Promise((r) => setImmediate(r));
    await this.uplink.stop(this.asleep ? 'sleeping' : 'offline');
    this.vars.close();
    this.commit.close();
    this.db.close();
    await this.local.close();
    this.log.info({ event: 'agent.stopped' });
  }

  status(): Record<string, unknown> {
    return {
      deviceId: this.identity.deviceId,
      // Enough to tell codes apart; the code itself is a capability (whoever has it can claim the device).
      authcodePrefix: this.identity.authcode.slice(0, 6),
      version: VERSION,
      platform: this.config.platform,
      fwVersion: this.firmware.version(),
      mode: this.mode,
      state: this.uplink.connected ? 'connected' : this.asleep ? 'sleeping' : 'disconnected',
      broker: safeUrl(this.config.mqtt.url),
      connects: this.uplink.connects,
      pending: this.vars.pending(),
      // Whether writes fail for lack of space now (`devcloud-agent doctor` reports it).
      storage: {
        full: this.commit.storage.full,
        fullSince: this.commit.storage.fullSince ?? null,
        refused: this.commit.storage.refused,
        freeBytes: freeBytes(this.config.stateDir) ?? null,
      },
      sync: this.vars.counters,
      dropped: this.uplink.dropped,
      nearby: { port: this.nearby.port ?? null, listening: this.nearby.listening, ...this.nearby.counters },
      hook: this.hook?.counters ?? null,
      // The runner's counters (since start) and, apart, what the queue holds by state: both have `failed` and
      // `expired`, which mean different things.
      commands: { ...this.commands.counters, pdeathsig: this.commands.launcher.pdeathsig, queue: this.queue.counts() },
      firmware: this.firmware.status(),
      uptimeMs: Math.round(this.clock.monotonic() - this.startedMono),
      clock: this.clock.status(),
      memory: process.memoryUsage(),
      lastErrors: recentProblems(this.log),
    };
  }

  /** What `devcloud-agent queue` shows. */
  queueView(recent: number): QueueJson {
    return {
      running: this.queue.running().map(commandJson),
      queued: this.queue.queued().map(commandJson),
      recent: this.queue.recent(recent).map(commandJson),
    };
  }

  private wire(): void {
    this.uplink.on('up', () => {
      this.touch();
      this.vars.onConnected();
      this.reporter.onConnected();
      this.commands.onConnected();
      this.firmware.onConnected();
      this.report.onConnected();
      // A wake is already settling (its time budget runs from the wake); this starts one after a mode change.
      if (this.mode === 'deadleaf' && this.settleTimer === undefined) this.startSettling();
    });
    this.uplink.on('down', () => this.vars.onDisconnected());
    this.uplink.on('message', (msg) => {
      // The bridge's clock first, so that what the message carries is judged by it.
      if (msg.payload.now !== undefined) this.clock.learn(msg.payload.now);
      this.touch();
      this.onMessage(msg);
    });
    this.vars.on('stamp', () => this.touch());
    this.vars.on('change', (ev) => this.onChange(ev));
  }

  private onMessage(msg: DownMessage): void {
    switch (msg.name) {
      case 'down/vars':
        this.vars.handleVars(msg.payload);
        return;
      case 'down/acks':
        this.vars.handleAcks(msg.payload);
        return;
      case 'down/cmd':
        void this.commands
          .onCommand(msg.payload)
          .catch((err: unknown) =>
            this.log.error({ event: 'cmd.store_failed', cmd: msg.payload.cmd, err: String(err) }),
          );
        return;
      case 'down/fw':
        this.firmware.onMessage(msg.payload);
        return;
    }
  }

  private onChange(ev: ChangeEvent): void {
    this.hook?.onChange(ev);
    const rec = ev.record;
    if (rec.type !== 'd') return;
    if (rec.name === 'mode') this.applyMode(this.readMode());
  }

  private hello(): HelloMessage {
    return {
      id: messageId(),
      protocol: 1,
      deviceId: this.identity.deviceId,
      authcode: this.identity.authcode,
      platform: this.config.platform,
      agentVersion: VERSION,
      fwVersion: this.firmware.version(),
      mode: this.mode,
      bootTime: this.startedAt,
      // The gateway's own clock: the cloud estimates from it the skew of versions stamped before contact.
      ts: this.ownNow(),
      clock: true,
    };
  }

  /** The `reboot` command: runs the configured reboot command; the gateway going down is its success. */
  private async reboot(): Promise<Outcome> {
    const [file, ...args] = this.config.commands.rebootCommand;
    this.log.warn({ event: 'cmd.reboot', command: this.config.commands.rebootCommand.join(' ') });
    // In a process group of its own (runInGroup), with no timeout: it ends when the gateway goes down.
    const r = await this.run({ file: file!, args });
    if (r.kind === 'spawn-error')
      return { state: 'failed', reason: `cannot run the reboot command: ${r.error.message}` };
    if (r.code !== 0) {
      return {
        state: 'failed',
        exitCode: r.code,
        signal: r.signal,
        reason: `the reboot command exited with status ${r.code}`,
      };
    }
    // The gateway is going down; were it still up in five minutes, the reboot did not happen.
    return new Promise<Outcome>((resolve) =>
      setTimeout(() => resolve({ state: 'failed', reason: 'the gateway did not reboot' }), 300_000).unref(),
    );
  }

  /** The `frmt` command: deletes every variable (tombstones, synchronised like any deletion). */
  private async factoryReset(): Promise<number> {
    let n = 0;
    for (const type of ['d', 's'] as const) {
      for (const rec of this.vars.list(type)) {
        await this.vars.remove(type, rec.name);
        n++;
      }
    }
    return n;
  }

  private readMode(): AgentMode {
    const rec = this.vars.get('d', 'mode');
    if (!rec) return 'master';
    const parsed = Mode.safeParse(rec.value!.toString('utf8'));
    if (!parsed.success) {
      this.log.warn({ event: 'mode.invalid', value: rec.value!.toString('utf8').slice(0, 64), using: 'master' });
      return 'master';
    }
    return parsed.data;
  }

  /** Seconds between deadleaf wakes, from `d` variable `deadleaf`. */
  deadleafPeriodMs(): number {
    const raw = this.vars.get('d', 'deadleaf')?.value?.toString('utf8');
    if (raw === undefined) return DEFAULT_DEADLEAF_SEC * 1000;
    const sec = Number(raw);
    if (!Number.isInteger(sec) || sec < MIN_DEADLEAF_SEC) {
      this.log.warn({ event: 'mode.deadleaf_invalid', value: raw.slice(0, 32), using: DEFAULT_DEADLEAF_SEC });
      return DEFAULT_DEADLEAF_SEC * 1000;
    }
    return sec * 1000;
  }

  private applyMode(next: AgentMode): void {
    if (next === this.mode || this.stopped) return;
    const prev = this.mode;
    this.mode = next;
    this.log.info({ event: 'mode.changed', from: prev, to: next });
    if (next === 'master') void this.startNearby();
    else this.nearby.stop();
    if (next === 'deadleaf') {
      // Stay up until the change is acknowledged and things are quiet, then sleep.
      if (this.uplink.connected) this.startSettling();
    } else {
      clearInterval(this.settleTimer);
      this.settleTimer = undefined;
      if (this.asleep) this.wake();
    }
  }

  private async startNearby(): Promise<void> {
    if (!this.config.udp.enabled || this.nearby.listening || this.stopped) return;
    await this.nearby.start();
  }

  private wake(): void {
    clearTimeout(this.wakeTimer);
    this.wakeTimer = undefined;
    if (this.stopped) return;
    if (this.asleep) this.log.info({ event: 'mode.wake' });
    this.asleep = false;
    this.awakeSince = this.now();
    if (this.mode === 'deadleaf') this.vars.resyncOnNextConnect();
    this.uplink.start();
    // Settling starts now, not on connect: a wake that cannot reach the broker still sleeps after awakeMaxMs.
    if (this.mode === 'deadleaf') this.startSettling();
  }

  private touch(): void {
    this.lastActivity = this.now();
  }

  /** In deadleaf mode: check often whether the wake's work is done. */
  private startSettling(): void {
    clearInterval(this.settleTimer);
    this.awakeSince = this.now();
    const every = Math.max(50, Math.min(250, this.config.sync.quietMs));
    this.settleTimer = setInterval(() => this.checkSettled(), every);
  }

  private checkSettled(): void {
    if (this.mode !== 'deadleaf' || this.stopped) return;
    const now = this.now();
    const quiet = now - this.lastActivity >= this.config.sync.quietMs;
    const overdue = now - this.awakeSince >= this.config.sync.awakeMaxMs;
    if (!this.uplink.connected && !overdue) return;
    if ((quiet && this.vars.isSettled()) || overdue) void this.sleep(overdue);
  }

  private async sleep(overdue: boolean): Promise<void> {
    clearInterval(this.settleTimer);
    this.settleTimer = undefined;
    this.asleep = true;
    const periodMs = this.deadleafPeriodMs();
    this.log.info({ event: 'mode.sleep', forMs: periodMs, pending: this.vars.pending(), overdue });
    await this.uplink.stop('sleeping');
    if (this.stopped || this.mode !== 'deadleaf') return;
    this.wakeTimer = setTimeout(() => this.wake(), periodMs);
  }
}

export function commandJson(c: QueuedCommand): CommandJson {
  const text = c.command.toString('latin1');
  return {
    id: c.id,
    ...(/^[\x20-\x7e]+$/.test(text) ? { command: text } : { command64: c.command.toString('base64') }),
    priority: c.priority,
    state: c.state,
    received: c.receivedAt,
    expires: c.expires,
    stateAt: c.stateAt,
    exitCode: c.exitCode,
    reason: c.reason,
    output: c.output,
    truncated: c.truncated,
  };
}
