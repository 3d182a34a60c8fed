/**
 * `devcloud-agent logs`: JSON lines from a file or standard input, formatted and filtered; lines that are not JSON
 * pass through. The journal path runs a stand-in `journalctl` (first on PATH) in a real CLI process, so that the
 * arguments it gets are checked without journald.
 */
import { randomUUID } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { chmodSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, describe, expect, it } from 'vitest';
import { runCli } from '../../agent/cli/index.js';
import { logsCommand } from '../../agent/cli/logs.js';
import { AGENT_MAIN, ROOT, tempDir } from '../support/agent.js';

const dir = tempDir('devcloud-logs-');
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const DEVICE = randomUUID();
const OTHER = randomUUID();
const CMD = randomUUID();
const JOB = randomUUID();

const records = [
  {
    level: 'info',
    time: '2026-11-22T07:47:33.182Z',
    service: 'devcloud-agent',
    deviceId: DEVICE,
    event: 'agent.started',
    version: '0.1.0',
    mode: 'master',
  },
  {
    level: 'info',
    time: '2026-11-22T07:47:34.000Z',
    service: 'devcloud-agent',
    deviceId: DEVICE,
    event: 'cmd.queued',
    cmd: CMD,
    priority: 0,
  },
  {
    level: 'warn',
    time: '2026-11-22T07:47:35.000Z',
    service: 'devcloud-agent',
    deviceId: DEVICE,
    event: 'mqtt.error',
    url: 'mqtt://b:1883',
    err: 'connect ECONNREFUSED 10.0.0.1:1883',
  },
  {
    level: 'info',
    time: '2026-11-22T07:47:36.000Z',
    service: 'devcloud-agent',
    deviceId: DEVICE,
    event: 'cmd.finished',
    cmd: CMD,
    state: 'failed',
    exitCode: 2,
    reason: 'exited with status 2',
  },
  {
    level: 'info',
    time: '2026-11-22T07:47:37.000Z',
    service: 'devcloud-agent',
    deviceId: DEVICE,
    event: 'fw.state',
    job: JOB,
    from: 'downloading',
    to: 'verifying',
  },
  {
    level: 'error',
    time: '2026-11-22T07:47:38.000Z',
    service: 'devcloud-bridge',
    deviceId: OTHER,
    event: 'cmd.finished',
    cmd: randomUUID(),
    state: 'done',
  },
];
const STACK = 'Error: boom\n    at main (file:///opt/devcloud/dist/agent/main.js:1:1)';
const text = [
  ...records.slice(0, 3).map((r) => JSON.stringify(r)),
  STACK,
  '',
  ...records.slice(3).map((r) => JSON.stringify(r)),
].join('\n');
const file = join(dir, 'agent.log');
writeFileSync(file, `${text}\n`);

async function logs(args: string[], stdin?: Readable): Promise<{ code: number; out: string[]; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const io = { out: (s: string) => out.push(s), err: (s: string) => err.push(s) };
  const code = stdin ? await logsCommand(args, io, stdin) : await runCli(['logs', ...args], io, {});
  return { code, out, err: err.join('\n') };
}

describe('devcloud-agent logs', () => {
  it('formats every JSON line as time, level, event and fields; other lines pass through', async () => {
    const r = await logs(['--file', file]);
    expect(r.code).toBe(0);
    expect(r.out).toEqual([
      '2026-11-22 07:47:33.182 INFO  agent.started version=0.1.0 mode=master',
      `2026-11-22 07:47:34.000 INFO  cmd.queued cmd=${CMD} priority=0`,
      '2026-11-22 07:47:35.000 WARN  mqtt.error url=mqtt://b:1883 err="connect ECONNREFUSED 10.0.0.1:1883"',
      'Error: boom',
      '    at main (file:///opt/devcloud/dist/agent/main.js:1:1)',
      `2026-11-22 07:47:36.000 INFO  cmd.finished cmd=${CMD} state=failed exitCode=2 reason="exited with status 2"`,
      `2026-11-22 07:47:37.000 INFO  fw.state job=${JOB} from=downloading to=verifying`,
      expect.stringMatching(/^2026-11-22 07:47:38\.000 ERROR cmd\.finished cmd=\S+ state=done$/),
    ]);
  });

  it('filters by event prefix, device, command, job and level', async () => {
    const events = (out: string[]) =>
      out.filter((l) => l.startsWith('2026')).map((l) => /^\S+ \S+ \w+ +(\S+)/.exec(l)?.[1]);
    const byEvent = await logs(['--file', file, '--event', 'cmd.']);
    expect(events(byEvent.out)).toEqual(['cmd.queued', 'cmd.finished', 'cmd.finished']);
    // A stack trace is kept whatever the filter: it may be why the agent stopped.
    expect(byEvent.out).toContain('Error: boom');

    const byDevice = await logs(['--file', file, '--device', OTHER]);
    expect(events(byDevice.out)).toEqual(['cmd.finished']);
    expect(byDevice.out.find((l) => l.startsWith('2026'))).toMatch(/ERROR/);

    const byCmd = await logs(['--file', file, '--cmd', CMD]);
    expect(events(byCmd.out)).toEqual(['cmd.queued', 'cmd.finished']);

    const byJob = await logs(['--file', file, '--job', JOB]);
    expect(events(byJob.out)).toEqual(['fw.state']);

    const byLevel = await logs(['--file', file, '--level', 'warn']);
    expect(events(byLevel.out)).toEqual(['mqtt.error', 'cmd.finished']);

    const both = await logs(['--file', file, '--event', 'cmd.finished', '--device', DEVICE]);
    expect(both.out.filter((l) => l.startsWith('2026'))).toEqual([
      `2026-11-22 07:47:36.000 INFO  cmd.finished cmd=${CMD} state=failed exitCode=2 reason="exited with status 2"`,
    ]);
  });

  it('--json prints the matching lines as they are; -n keeps the last N', async () => {
    const j = await logs(['--file', file, '--json', '--cmd', CMD]);
    expect(j.out.filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as unknown)).toEqual([
      records[1],
      records[3],
    ]);
    const last = await logs(['--file', file, '-n', '2']);
    expect(last.out).toHaveLength(2);
    expect(last.out[0]).toMatch(/ fw\.state /);
    expect(last.out[1]).toMatch(/ ERROR cmd\.finished /);
  });

  it('reads standard input with --file -', async () => {
    const r = await logs(['--file', '-', '--event', 'mqtt.'], Readable.from([`${text}\n`]));
    expect(r.code).toBe(0);
    expect(r.out.filter((l) => l.startsWith('2026'))).toEqual([
      '2026-11-22 07:47:35.000 WARN  mqtt.error url=mqtt://b:1883 err="connect ECONNREFUSED 10.0.0.1:1883"',
    ]);
  });

  it('usage errors exit 2; a missing file exits 1', async () => {
    expect((await logs(['--level', 'loud'])).code).toBe(2);
    expect((await logs(['--frobnicate'])).code).toBe(2);
    expect((await logs(['--file', file, '--since', 'today'])).code).toBe(2);
    expect((await logs(['--event'])).code).toBe(2);
    const missing = await logs(['--file', join(dir, 'nope.log')]);
    expect(missing.code).toBe(1);
    expect(missing.err).toMatch(/cannot read .*nope\.log: ENOENT/);
  });

  it('reads the journal through journalctl -u devcloud-agent -o cat', () => {
    const bin = join(dir, 'bin');
    spawnSync('mkdir', ['-p', bin]);
    const fake = join(bin, 'journalctl');
    // Prints the arguments it got (not JSON: passed through), then the log.
    writeFileSync(fake, `#!/bin/sh\necho "journalctl $*"\ncat ${JSON.stringify(file)}\n`);
    chmodSync(fake, 0o755);
    const run = spawnSync(
      process.execPath,
      [AGENT_MAIN, 'logs', '--no-follow', '--since', '1 hour ago', '-n', '50', '--event', 'fw.'],
      { cwd: ROOT, env: { PATH: `${bin}:${process.env.PATH}`, HOME: process.env.HOME }, encoding: 'utf8' },
    );
    expect(run.status, run.stderr).toBe(0);
    expect(
      run.stdout.split('\n').filter((l) => l !== '' && !l.startsWith('Error: boom') && !l.startsWith('    at')),
    ).toEqual([
      'journalctl -u devcloud-agent -o cat --no-pager --since 1 hour ago -n 50',
      `2026-11-22 07:47:37.000 INFO  fw.state job=${JOB} from=downloading to=verifying`,
    ]);
  });
});
