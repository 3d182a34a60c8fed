/**
 * `devcloud-agent`: runs the agent, and talks to a running one through its local socket.
 *
 * Exit codes: 0 success; 1 the operation failed (for example, no such variable); 2 usage or configuration
 * error; 3 the agent cannot be reached.
 */
import { ConfigError, formatOptions, parseArgs } from '../../lib/config.js';
import { LOG_LEVELS, createLogger } from '../../lib/log.js';
import { VERSION } from '../../lib/version.js';
import { Agent, RESTART_EXIT_CODE } from '../agent.js';
import { AGENT_OPTIONS, type AgentConfig, loadAgentConfig, clientSocketPath } from '../config.js';
import { LocalClient, LocalClientError } from '../local/client.js';
import { createNotifier } from '../systemd/notify.js';
import type { CommandJson, QueueJson, VarJson } from '../local/messages.js';

export const EXIT = { ok: 0, failed: 1, usage: 2, unreachable: 3 } as const;

const USAGE = `devcloud-agent ${VERSION}: the devcloud agent for Linux gateways

Usage:
  devcloud-agent [run] [options]            run the agent (what the systemd unit does)
  devcloud-agent var list [--type d|s]      list variables
  devcloud-agent var get NAME [--type d|s]  print a value (--json: the record with its stamps)
  devcloud-agent var set NAME VALUE [--type d|s]
  devcloud-agent var rm NAME [--type d|s]   delete a variable (synchronised to the cloud)
  devcloud-agent var sync NAME              re-send a d variable to the cloud without changing it
  devcloud-agent var watch                  follow changes and acknowledgements, one JSON line each
  devcloud-agent log-level LEVEL            change the running agent's log level
  devcloud-agent status                     identity, connection, pending syncs, queue, firmware, last errors
                                            (--json: everything; without a running agent: what the state
                                            directory holds, exit status 3)
  devcloud-agent queue [--recent N]         the command queue: running, queued (in run order), recent
  devcloud-agent doctor                     check config, state directory, identity, broker login, UDP port,
                                            clock, disk space and firmware keys (exit 1 when a check fails)
  devcloud-agent logs [options]             the agent's journal, readable and filtered (logs --help)
  devcloud-agent fw status                  the firmware update: state, job, slots, steps
  devcloud-agent fw commit                  accept a switched image now (skips the rest of the health check)
  devcloud-agent fw rollback                return to the image that ran before the update (works without
                                            a running agent: the systemd OnFailure= entry point)

Options:
${formatOptions(AGENT_OPTIONS)}
  --type d|s            variable type for the var commands (default d)
  --recent N            queue: how many recent commands to show (default 20)
  --json                print JSON
  -h, --help            this help

Exit codes: 0 success, 1 the operation failed, 2 usage or configuration error, 3 agent not reachable.
`;

interface Out {
  out: (s: string) => void;
  err: (s: string) => void;
}

const stdio: Out = {
  out: (s) => process.stdout.write(`${s}\n`),
  err: (s) => process.stderr.write(`${s}\n`),
};

/** Pulls the client-only flags out of argv before the shared option parser sees it. */
function takeClientFlags(argv: string[]): { rest: string[]; type: string; json: boolean; recent: string } {
  const rest: string[] = [];
  let type = 'd';
  let json = false;
  let recent = '20';
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--json') json = true;
    else if (a === '--recent') recent = argv[++i] ?? '';
    else if (a === '--type') type = argv[++i] ?? '';
    else if (a.startsWith('--type=')) type = a.slice('--type='.length);
    else rest.push(a);
  }
  return { rest, type, json, recent };
}

// The commands other than `run` and the variable and queue commands are imported when they are run: the running
// agent never needs them, and each module loaded stays in its heap for good (docs/agent.md, memory).
export async function runCli(argv: string[], io: Out = stdio, env: NodeJS.ProcessEnv = process.env): Promise<number> {
  // `logs` reads the journal or a file and has flags of its own; it needs no config.
  if (argv[0] === 'logs') return (await import('./logs.js')).logsCommand(argv.slice(1), io);
  const { rest, type, json, recent } = takeClientFlags(argv);
  const args = parseArgs(rest, AGENT_OPTIONS);
  if (args.help || args.positionals[0] === 'help') {
    io.out(USAGE);
    return EXIT.ok;
  }
  const [command = 'run', ...params] = args.positionals;
  let config: AgentConfig | undefined;
  // Flag problems and config problems are reported together, so one run shows everything to fix.
  const problems = [...args.problems];
  try {
    config = loadAgentConfig({ flags: args.flags, env });
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    problems.push(...err.problems);
  }
  // The doctor reports config problems as its first checks.
  if (command === 'doctor')
    return (await import('./doctor.js')).doctorCommand({ config, problems, flags: args.flags, params, env, json, io });
  if (problems.length > 0 || config === undefined) {
    io.err(`devcloud-agent: ${new ConfigError(problems).message}`);
    io.err('Run devcloud-agent --help for the options.');
    return EXIT.usage;
  }
  if (type !== 'd' && type !== 's') {
    io.err(`devcloud-agent: --type must be d or s, not ${JSON.stringify(type)}`);
    return EXIT.usage;
  }

  switch (command) {
    case 'run':
      if (params.length > 0) return usage(io, `unexpected argument ${params[0]}`);
      return runAgent(config, env);
    case 'var':
      return withClient(config, env, io, (c) => varCommand(c, params, type, json, io));
    case 'log-level': {
      const level = params[0];
      if (!level || !(LOG_LEVELS as readonly string[]).includes(level)) {
        return usage(io, `log-level needs one of ${LOG_LEVELS.join(', ')}`);
      }
      return withClient(config, env, io, async (c) => {
        await c.request({ op: 'log-level', level });
        io.out(`log level is now ${level}`);
        return EXIT.ok;
      });
    }
    case 'status':
      if (params.length > 0) return usage(io, 'status takes no arguments');
      return (await import('./status.js')).statusCommand(config, env, json, io);
    case 'queue': {
      if (params.length > 0) return usage(io, 'queue takes no arguments');
      if (!/^\d{1,4}$/.test(recent) || Number(recent) > 1000)
        return usage(io, '--recent needs a number from 0 to 1000');
      const showQueue = (q: QueueJson) => {
        if (json) io.out(JSON.stringify(q));
        else printQueue(q, io);
        return EXIT.ok;
      };
      return withClient(
        config,
        env,
        io,
        async (c) => showQueue(await c.queue(Number(recent))),
        // The queue is in the database: without a running agent it is read from there.
        async () => {
          const q = (await import('./status.js')).readOfflineQueue(config, Number(recent));
          if (typeof q === 'string') return undefined;
          io.err(`devcloud-agent: the agent is not running; read from ${config.stateDir}`);
          return showQueue(q);
        },
      );
    }
    case 'fw':
      return (await import('./fw.js')).fwCommand(config, env, params, json, io);
    default:
      return usage(io, `unknown command ${command}`);
  }
}

function usage(io: Out, problem: string): number {
  io.err(`devcloud-agent: ${problem}`);
  io.err('Run devcloud-agent --help for usage.');
  return EXIT.usage;
}

async function withClient(
  config: AgentConfig,
  env: NodeJS.ProcessEnv,
  io: Out,
  fn: (c: LocalClient) => Promise<number>,
  offline?: () => Promise<number | undefined>,
): Promise<number> {
  const path = clientSocketPath(config, env);
  let client: LocalClient;
  try {
    client = await LocalClient.connect(path);
  } catch (err) {
    const done = await offline?.();
    if (done !== undefined) return done;
    io.err(`devcloud-agent: ${(err as Error).message}. Is the agent running? (systemctl status devcloud-agent)`);
    return EXIT.unreachable;
  }
  try {
    return await fn(client);
  } catch (err) {
    if (err instanceof LocalClientError) {
      io.err(`devcloud-agent: ${err.message} (${err.code})`);
      return err.code === 'bad-request' || err.code === 'bad-name' ? EXIT.usage : EXIT.failed;
    }
    throw err;
  } finally {
    client.close();
  }
}

function commandLine(c: CommandJson): string {
  const what = c.command ?? `base64:${c.command64}`;
  const end = c.exitCode === null ? '' : ` exit ${c.exitCode}`;
  const why = c.reason === null ? '' : ` (${c.reason})`;
  return `${c.id}  p${c.priority}  ${c.state.padEnd(7)}  ${new Date(c.stateAt).toISOString()}  ${what}${end}${why}`;
}

function printQueue(q: QueueJson, io: Out): void {
  io.out(`running (${q.running.length})`);
  for (const c of q.running) io.out(`  ${commandLine(c)}`);
  io.out(`queued, in run order (${q.queued.length})`);
  for (const c of q.queued) io.out(`  ${commandLine(c)}   expires ${new Date(c.expires).toISOString()}`);
  io.out(`recent (${q.recent.length})`);
  for (const c of q.recent) io.out(`  ${commandLine(c)}`);
}

function show(v: VarJson): string {
  if (v.deleted) return '(deleted)';
  return v.value ?? `base64:${v.value64}`;
}

function stampLine(v: VarJson): string {
  const state = v.acked >= v.time ? 'acked' : 'pending';
  return `${v.type} ${v.name}=${show(v)}  [${v.origin} ${new Date(v.time).toISOString()} ${state}]`;
}

async function varCommand(c: LocalClient, params: string[], type: 'd' | 's', json: boolean, io: Out): Promise<number> {
  const [sub, name, value, ...extra] = params;
  const need = (n: number) => params.length - 1 === n;
  switch (sub) {
    case 'list': {
      if (!need(0)) return usage(io, 'var list takes no arguments');
      const vars = await c.list(type);
      if (json) io.out(JSON.stringify(vars));
      else for (const v of vars) io.out(stampLine(v));
      return EXIT.ok;
    }
    case 'get': {
      if (!need(1)) return usage(io, 'var get needs NAME');
      const v = await c.get(type, name!);
      io.out(json ? JSON.stringify(v) : show(v));
      return EXIT.ok;
    }
    case 'set': {
      if (value === undefined || extra.length > 0) return usage(io, 'var set needs NAME and VALUE');
      const v = await c.set(type, name!, value);
      if (json) io.out(JSON.stringify(v));
      return EXIT.ok;
    }
    case 'rm': {
      if (!need(1)) return usage(io, 'var rm needs NAME');
      const v = await c.rm(type, name!);
      if (json) io.out(JSON.stringify(v));
      return EXIT.ok;
    }
    case 'sync': {
      if (!need(1)) return usage(io, 'var sync needs NAME');
      const v = await c.sync(type, name!);
      if (json) io.out(JSON.stringify(v));
      return EXIT.ok;
    }
    case 'watch': {
      if (!need(0)) return usage(io, 'var watch takes no arguments');
      await c.watch((ev) => io.out(JSON.stringify(ev)));
      // Runs until the agent goes away or the user interrupts.
      await Promise.race([c.closed, new Promise((resolve) => process.once('SIGINT', resolve))]);
      return EXIT.ok;
    }
    default:
      return usage(io, 'var needs one of list, get, set, rm, sync, watch');
  }
}

/** Runs the agent until SIGTERM or SIGINT; stops within 5 s. */
async function runAgent(config: AgentConfig, env: NodeJS.ProcessEnv): Promise<number> {
  const log = createLogger({ level: config.log.level, pretty: config.log.pretty, base: { service: 'devcloud-agent' } });
  // systemd's Type=notify: READY once started, watchdog pings, STOPPING; nothing without $NOTIFY_SOCKET.
  const notify = createNotifier({ env, log });
  let agent: Agent;
  try {
    agent = await Agent.start({
      config,
      log,
      env,
      onRestart: () => {
        notify.stopping('restarting');
        process.exit(RESTART_EXIT_CODE);
      },
    });
  } catch (err) {
    log.fatal({ event: 'agent.start_failed', err: err instanceof Error ? err.message : String(err) });
    notify.close();
    return EXIT.failed;
  }
  notify.ready('running');
  process.on('uncaughtException', (err) => {
    log.fatal({ event: 'agent.crashed', err: err.message, stack: err.stack });
    process.exit(EXIT.failed);
  });
  process.on('unhandledRejection', (reason) => {
    log.fatal({ event: 'agent.crashed', err: reason instanceof Error ? reason.message : String(reason) });
    process.exit(EXIT.failed);
  });
  return new Promise<number>((resolve) => {
    const shutdown = (signal: string) => {
      log.info({ event: 'agent.signal', signal });
      // Whatever happens, the process is gone within 5 s.
      setTimeout(() => {
        log.error({ event: 'agent.stop_timeout', msg: 'did not stop within 5 s; exiting' });
        process.exit(EXIT.failed);
      }, 5000).unref();
      notify.stopping('stopping');
      agent.stop().then(
        () => {
          notify.close();
          resolve(EXIT.ok);
        },
        (err: unknown) => {
          log.error({ event: 'agent.stop_failed', err: String(err) });
          notify.close();
          resolve(EXIT.failed);
        },
      );
    };
    process.once('SIGTERM', () => shutdown('SIGTERM'));
    process.once('SIGINT', () => shutdown('SIGINT'));
  });
}
