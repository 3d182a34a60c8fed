/**
 * The processes of executable handlers, seen through /proc (docs/agent.md, the command runner: a handler dies
 * with the agent). A handler runs in its own process group whose id is its pid; the agent records the pid and the
 * process's start time, so that after a crash it can end a group that survived without ever signalling an
 * unrelated process that was given the same pid since.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

/** `/proc/<pid>/stat` after the command name: state is the first field, then ppid, pgrp, ..., starttime. */
function statFields(pid: number): string[] | undefined {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // The name is in parentheses and may hold spaces or parentheses itself: the fields start after the last `)`.
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
}

/** The start time of a process in clock ticks since boot (field 22 of /proc/<pid>/stat), or `null`. */
export function processStartTicks(pid: number): number | null {
  const f = statFields(pid);
  const ticks = f ? Number(f[19]) : NaN;
  return Number.isSafeInteger(ticks) ? ticks : null;
}

function groupOf(pid: number): number | undefined {
  const f = statFields(pid);
  if (!f || f[0] === 'Z') return undefined;
  const pgrp = Number(f[2]);
  return Number.isSafeInteger(pgrp) ? pgrp : undefined;
}

/**
 * Whether the process group a handler was started as still has live members. The leader counts only if it is the
 * same process (same start time). Without the leader, a member whose group is `pgid` can only be from that group:
 * Linux gives no new process a pid that is still some group's id.
 */
export function groupSurvives(pgid: number, startTicks: number): boolean {
  const leader = processStartTicks(pgid);
  // Another process under that pid: the group was empty when the pid was given again.
  if (leader !== null && leader !== startTicks) return false;
  if (leader !== null && groupOf(pgid) === pgid) return true;
  // The leader is gone, or a zombie nobody reaps (an init that does not, in a container): its members may live on.
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return false;
  }
  for (const e of entries) {
    if (!/^\d+$/.test(e)) continue;
    if (groupOf(Number(e)) === pgid) return true;
  }
  return false;
}

/** SIGKILL to a whole group; `false` when there was no such group any more. */
export function killGroup(pgid: number): boolean {
  try {
    process.kill(-pgid, 'SIGKILL');
    return true;
  } catch {
    return false;
  }
}

/**
 * How a handler is started: `setpriv --pdeathsig KILL` (util-linux) when the system has one that knows the option,
 * so the kernel kills the handler when the agent dies, then `/bin/sh` waiting for one line on standard input before
 * it executes the handler, so a handler never starts before the agent has recorded its process.
 */
export interface Launcher {
  /** The program and the arguments before the handler's path and its own arguments. */
  file: string;
  args: string[];
  pdeathsig: boolean;
}

const GATE = 'IFS= read -r _ || exit 125; exec "$0" "$@"';

/** Looks for `setpriv` on the agent's PATH (the service's default PATH has /usr/bin, where util-linux puts it). */
export function findLauncher(searchPath = process.env.PATH ?? ''): Launcher {
  const candidates = searchPath
    .split(':')
    .filter((d) => d.startsWith('/'))
    .map((d) => join(d, 'setpriv'));
  for (const path of candidates) {
    if (!existsSync(path)) continue;
    const help = spawnSync(path, ['--help'], { encoding: 'utf8', timeout: 5000 });
    if (`${help.stdout ?? ''}`.includes('--pdeathsig')) {
      return { file: path, args: ['--pdeathsig', 'KILL', '--', '/bin/sh', '-c', GATE], pdeathsig: true };
    }
  }
  return { file: '/bin/sh', args: ['-c', GATE], pdeathsig: false };
}
