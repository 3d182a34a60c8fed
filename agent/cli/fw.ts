/**
 * `devcloud-agent fw status|commit|rollback`. With the agent running, the request goes through its local socket
 * and the agent acts. Without it (a crash loop after an update, where systemd's `OnFailure=` runs
 * `devcloud-agent fw rollback`), the command opens the state directory itself and runs the same state machine
 * until the job settles, so the rollback does not depend on the agent that failed.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { createLogger } from '../../lib/log.js';
import { openDatabase } from '../../lib/sqlite.js';
import type { AgentConfig } from '../config.js';
import { clientSocketPath } from '../config.js';
import { updaterFor } from '../fw/updater.js';
import { LocalClient, LocalClientError } from '../local/client.js';
import { AGENT_MIGRATIONS } from '../migrations.js';

interface Out {
  out: (s: string) => void;
  err: (s: string) => void;
}

const EXIT = { ok: 0, failed: 1, usage: 2, unreachable: 3 } as const;

type FwOp = 'status' | 'commit' | 'rollback';

export async function fwCommand(
  config: AgentConfig,
  env: NodeJS.ProcessEnv,
  params: string[],
  json: boolean,
  io: Out,
): Promise<number> {
  const [op, ...extra] = params;
  if (op !== 'status' && op !== 'commit' && op !== 'rollback') {
    io.err('devcloud-agent: fw needs one of status, commit, rollback');
    return EXIT.usage;
  }
  if (extra.length > 0) {
    io.err(`devcloud-agent: fw ${op} takes no arguments`);
    return EXIT.usage;
  }
  let client: LocalClient | undefined;
  try {
    client = await LocalClient.connect(clientSocketPath(config, env));
  } catch {
    client = undefined;
  }
  let result: Record<string, unknown>;
  if (client) {
    try {
      result = await ask(client, op);
    } catch (err) {
      if (err instanceof LocalClientError) {
        io.err(`devcloud-agent: ${err.message} (${err.code})`);
        return EXIT.failed;
      }
      throw err;
    } finally {
      client.close();
    }
  } else {
    const r = await offline(config, op, io);
    if (typeof r === 'number') return r;
    result = r;
  }
  if (json) io.out(JSON.stringify(result));
  else printStatus(result, io);
  return EXIT.ok;
}

function ask(c: LocalClient, op: FwOp): Promise<Record<string, unknown>> {
  if (op === 'commit') return c.fwCommit();
  if (op === 'rollback') return c.fwRollback();
  return c.fwStatus();
}

/** Acts on the state directory when no agent answers on the socket. */
async function offline(config: AgentConfig, op: FwOp, io: Out): Promise<Record<string, unknown> | number> {
  const dbPath = join(config.stateDir, 'agent.db');
  if (!existsSync(dbPath)) {
    io.err(`devcloud-agent: no agent state in ${config.stateDir} (and no agent answers on its socket)`);
    return EXIT.unreachable;
  }
  io.err(`devcloud-agent: the agent is not running; working on ${config.stateDir} directly`);
  const db = openDatabase(dbPath, AGENT_MIGRATIONS);
  // Logs go to stderr, so a unit's journal shows what the rollback did.
  const log = createLogger({
    level: config.log.level,
    pretty: 'never',
    base: { service: 'devcloud-agent', tool: 'fw' },
    destination: process.stderr,
  });
  try {
    const fw = updaterFor(config, {
      db,
      // Reported by the agent when it next connects: the saved state is the outbox.
      reporter: { publish: () => false, connected: false },
      // The service manager starts the agent after this command (the rollback unit does).
      restartAgent: () => undefined,
      log,
      now: Date.now,
    });
    if (op !== 'status') {
      const r = op === 'commit' ? fw.commit() : fw.rollback('rolled back by hand (agent not running)');
      if (!r.ok) {
        io.err(`devcloud-agent: ${r.why ?? 'refused'}`);
        return EXIT.failed;
      }
      const job = await fw.settled();
      if (job && job.state === 'rollingback') {
        io.err(`devcloud-agent: the rollback did not finish: ${withCode(job.error, job.errorCode)}`);
        return EXIT.failed;
      }
    }
    return fw.status();
  } finally {
    db.close();
  }
}

/** An error as `fw status` and `status` print it: its code (`fwerrorcode`) first, when it has one. */
export function withCode(error: string, code: string | undefined): string {
  return code ? `[${code}] ${error}` : error;
}

function printStatus(s: Record<string, unknown>, io: Out): void {
  const job = s.job as {
    id: string;
    name: string;
    version: number;
    progress: number;
    error: string;
    errorCode?: string;
    attempts: number;
    fromSlot: string | null;
    toSlot: string | null;
    steps: Array<{ state: string; at: number; error: string; errorCode?: string }>;
  } | null;
  io.out(`state    ${String(s.state)}`);
  io.out(`version  ${String(s.version)} (running)`);
  io.out(`installer ${String(s.installer)}, restart ${String(s.restart)}`);
  if (s.slotsDir) io.out(`slots    ${s.slotsDir as string}: active ${String(s.activeSlot)}`);
  if (!job) {
    io.out('no update has been received');
    return;
  }
  io.out(`job      ${job.id}  ${job.name} version ${job.version}  progress ${job.progress}%  attempt ${job.attempts}`);
  if (job.fromSlot || job.toSlot) io.out(`         from slot ${job.fromSlot ?? '?'} to slot ${job.toSlot ?? '?'}`);
  if (job.error) io.out(`error    ${withCode(job.error, job.errorCode)}`);
  io.out('steps');
  for (const st of job.steps) {
    const error = st.error ? `  ${withCode(st.error, st.errorCode)}` : '';
    io.out(`  ${new Date(st.at).toISOString()}  ${st.state.padEnd(11)}${error}`);
  }
}
