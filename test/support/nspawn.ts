/**
 * A Debian machine booted with systemd as PID 1, for the tests of the Debian packages: `systemd-nspawn --boot` on a
 * copy of the root that scripts/debian-root.sh keeps (an overlay on it where the kernel allows one, else a copy),
 * with a network of its own (`--private-network`: only its own loopback, so fixed ports inside cannot meet the
 * host's). Commands run inside through `nsenter` into the container's namespaces, as a shell on the machine would:
 * no machined or D-Bus of the host is needed.
 */
import { type ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from './agent.js';
import { until } from './wait.js';

export interface Run {
  status: number;
  stdout: string;
  stderr: string;
}

/** The cached root of scripts/debian-root.sh for `arch`, made first if there is none (a minute, from Debian's mirror). */
export function debianRoot(arch: 'amd64' | 'arm64' | 'armhf'): string {
  const out = execFileSync('sh', [join(ROOT, 'scripts/debian-root.sh'), '--arch', arch], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
    timeout: 600_000,
  });
  return out.trim().split('\n').pop()!;
}

function children(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

export class BootedDebian {
  private constructor(
    private readonly proc: ChildProcess,
    private readonly dir: string,
    private readonly root: string,
    private readonly overlay: boolean,
  ) {}

  /** PID of the container's systemd, seen from the host. */
  init = 0;

  /** Boots a machine on a throw-away copy of `lower` in `dir`; resolves once systemd says the boot is done. */
  static async boot(lower: string, dir: string, name: string): Promise<BootedDebian> {
    const root = join(dir, 'root');
    mkdirSync(root, { recursive: true });
    let overlay = false;
    try {
      mkdirSync(join(dir, 'upper'));
      mkdirSync(join(dir, 'work'));
      execFileSync(
        'mount',
        ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lower},upperdir=${dir}/upper,workdir=${dir}/work`, root],
        { stdio: 'ignore' },
      );
      overlay = true;
    } catch {
      cpSync(lower, root, { recursive: true, verbatimSymlinks: true, preserveTimestamps: true });
    }
    let output = '';
    const proc = spawn(
      'systemd-nspawn',
      ['-D', root, '--boot', '--register=no', '--keep-unit', '--private-network', `--machine=${name}`, '--quiet'],
      { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, SYSTEMD_COLORS: '0' } },
    );
    proc.stdout.on('data', (d: Buffer) => (output += d.toString()));
    proc.stderr.on('data', (d: Buffer) => (output += d.toString()));
    const machine = new BootedDebian(proc, dir, root, overlay);
    try {
      // The container's systemd is nspawn's child, or its grandchild where nspawn forks a helper first.
      await until(
        () => {
          if (proc.exitCode !== null) throw new Error(`systemd-nspawn exited: ${output}`);
          const found = [...children(proc.pid!), ...children(proc.pid!).flatMap(children)].find((pid) => {
            try {
              return readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'systemd';
            } catch {
              return false;
            }
          });
          if (found === undefined) return false;
          machine.init = found;
          return true;
        },
        'the container to start systemd',
        30_000,
      );
      // `--wait` returns when the boot has finished; "degraded" (a unit failed at boot) is still a booted machine.
      // Before systemd opens its own socket systemctl cannot ask it at all (no answer), and before it has made
      // /run/systemd/system it says "offline": asked again in both cases.
      let state: Run = { status: -1, stdout: '', stderr: '' };
      await machine.waitFor(
        () => {
          state = machine.run(['systemctl', 'is-system-running', '--wait'], { timeoutMs: 60_000 });
          return !['', 'offline'].includes(state.stdout.trim());
        },
        'systemd in the container to answer',
        60_000,
      );
      if (!['running', 'degraded'].includes(state.stdout.trim())) {
        throw new Error(`the machine did not boot: ${state.stdout}${state.stderr}\n${output}`);
      }
    } catch (err) {
      await machine.stop();
      throw err;
    }
    return machine;
  }

  /**
   * Polls `check` (which usually runs commands inside) every quarter second until it returns true; throws naming
   * `what` after `ms`.
   */
  async waitFor(check: () => boolean, what: string, ms = 60_000): Promise<void> {
    const deadline = Date.now() + ms;
    while (!check()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 250));
    }
  }

  /** A path of the machine's file system, seen from the host. */
  path(p: string): string {
    return join(this.root, p);
  }

  /** Runs a command inside, as root, with a login shell's PATH. */
  run(argv: string[], opts: { timeoutMs?: number; input?: string } = {}): Run {
    const r = spawnSync(
      'nsenter',
      [
        '-t',
        String(this.init),
        '-a',
        'env',
        '-i',
        'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
        'LANG=C.UTF-8',
        'SYSTEMD_COLORS=0',
        'SYSTEMD_PAGER=',
        'DEBIAN_FRONTEND=noninteractive',
        ...argv,
      ],
      { encoding: 'utf8', timeout: opts.timeoutMs ?? 120_000, input: opts.input },
    );
    if (r.error) throw new Error(`${argv.join(' ')}: ${r.error.message}`);
    return { status: r.status ?? -1, stdout: r.stdout, stderr: r.stderr };
  }

  /** Runs a shell command inside; throws with its output unless it exits 0. */
  sh(script: string, opts: { timeoutMs?: number } = {}): string {
    const r = this.run(['sh', '-ec', script], opts);
    if (r.status !== 0) throw new Error(`inside the machine: ${script}\nexit ${r.status}\n${r.stdout}${r.stderr}`);
    return r.stdout;
  }

  /** `systemctl show` of one unit as an object. */
  show(unit: string, ...props: string[]): Record<string, string> {
    const out = this.sh(`systemctl show ${unit} ${props.map((p) => `-p ${p}`).join(' ')}`);
    return Object.fromEntries(
      out
        .split('\n')
        .filter((l) => l.includes('='))
        .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
    );
  }

  /** The journal of one unit (messages only), from a cursor-free start: the whole boot. */
  journal(unit: string): string[] {
    return this.sh(`journalctl -u ${unit} -b --no-pager -o cat`).split('\n');
  }

  /** Powers the machine off, then removes its copy of the root. */
  async stop(): Promise<void> {
    if (this.proc.exitCode === null) {
      const exited = new Promise<void>((resolve) => this.proc.once('exit', () => resolve()));
      // SIGTERM to nspawn asks the container's systemd for a clean shutdown.
      this.proc.kill('SIGTERM');
      const timer = setTimeout(() => this.proc.kill('SIGKILL'), 30_000);
      await exited;
      clearTimeout(timer);
    }
    if (this.overlay) spawnSync('umount', [this.root]);
    // What nspawn may have left mounted under the root when killed.
    for (const entry of readdirSync(this.dir)) rmSync(join(this.dir, entry), { recursive: true, force: true });
  }
}
