/**
 * `npm run bench -- rules` at a tiny size, as a process of its own, the way it is run (bench/README.md, "rules"):
 * two bridges, their devices and live channels, every phase. Its figures at this size mean nothing; what is checked
 * is that it runs through and reports what it should: every spike fired once and its `user-event` frame was matched,
 * and its one JSON line has every figure. And the profile summary the benchmark reports with `--cpu-prof`.
 */
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { profileShare, type CpuProfile } from '../../bench/support/cpu-profile.js';

const ROOT = join(import.meta.dirname, '../..');

function runBench(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const proc = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'bench/run.ts'), 'rules', ...args], {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    proc.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    proc.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    proc.once('error', reject);
    proc.once('exit', (code) => resolve({ code, stdout, stderr }));
  });
}

const num = expect.any(Number) as unknown;

describe('npm run bench -- rules', () => {
  it('runs at a tiny size and ends with the JSON line of every figure', { timeout: 180_000 }, async () => {
    const { code, stdout, stderr } = await runBench([
      ...['--devices', '12', '--users', '3', '--rules-per-device', '4', '--rate', '30'],
      ...['--duration', '2', '--warmup', '1', '--drain-s', '3', '--rounds', '1', '--fire-fraction', '0.3'],
      ...['--log-level', 'warn'],
    ]);
    // 0 or 1: the targets are judged, and at this size either may be missed; 2 (usage) or a crash is a failure.
    expect([0, 1], stderr.slice(-2000)).toContain(code);
    expect(stdout).toMatch(/^(PASS|MISS) bridge CPU added by the rules per change: /m);
    expect(stdout).toMatch(/^(PASS|MISS) change → user-event p99: /m);
    const lines = stdout.trim().split('\n');
    const out = JSON.parse(lines[lines.length - 1]!) as Record<string, unknown>;
    expect(out).toMatchObject({
      bench: 'rules',
      engine: 'sqlite',
      rules: {
        total: 48,
        perDevice: 4,
        users: 3,
        triggers: ['d.temp > 30', 'd.temp < 0', 'd.humidity > 80', 's.mode == "eco"'],
      },
      cpu: { judged: 'paired', baselineUsPerChange: num, rulesUsPerChange: num, addedUsPerChange: num },
      latency: { p50: num, p95: num, p99: num, max: num },
      ackToEvent: { p50: num, p99: num },
      target: { addedUsPerChange: 20, p99Ms: 50 },
      met: { cpu: expect.any(Boolean) as unknown, latency: expect.any(Boolean) as unknown },
    });
    const events = out.events as Record<
      'spikes' | 'fired' | 'expected' | 'received' | 'missing' | 'duplicates' | 'unexpected' | 'suppressed' | 'failed',
      number
    >;
    // Every spike fired its one rule, and each one in the measured windows reached its user's channel once.
    expect(events.spikes).toBeGreaterThan(0);
    expect(events.fired).toBe(events.spikes);
    expect(events.expected).toBeGreaterThan(0);
    expect(events.received).toBe(events.expected);
    expect([events.missing, events.duplicates, events.unexpected, events.suppressed, events.failed]).toEqual([
      0, 0, 0, 0, 0,
    ]);
    expect((out.latency as { n: number }).n).toBe(events.received - (out.pairedLatency as { n: number }).n);
    // Each bridge alone, then both at once: four phases, every change acknowledged, the same load for each.
    const phases = out.phases as Array<{ label: string; mode: string; sent: number; acked: number }>;
    expect(phases.map((p) => `${p.label}/${p.mode}`)).toEqual([
      'no rules/alone',
      'rules/alone',
      'no rules/paired',
      'rules/paired',
    ]);
    for (const p of phases) {
      expect(p.sent).toBe(60);
      expect(p.acked).toBe(p.sent);
    }
  });

  it('refuses an option it does not know, with exit code 2', async () => {
    const { code, stderr } = await runBench(['--no-such-option']);
    expect(code).toBe(2);
    expect(stderr).toMatch(/--no-such-option/);
  });
});

describe('CPU profile summary', () => {
  it('counts a sample under a matching frame, callees included, and names where the time went', () => {
    const frame = (functionName: string, url: string, lineNumber = 0) => ({ functionName, url, lineNumber });
    const profile: CpuProfile = {
      nodes: [
        { id: 1, callFrame: frame('(root)', ''), children: [2, 5, 6] },
        { id: 2, callFrame: frame('onVars', 'file:///x/dist/bridge/rules/engine.js', 9), children: [3] },
        { id: 3, callFrame: frame('getVar', 'file:///x/dist/bridge/devices/store.js', 263), children: [] },
        { id: 5, callFrame: frame('flush', 'file:///x/dist/bridge/live/hub.js'), children: [] },
        { id: 6, callFrame: frame('(idle)', ''), children: [] },
      ],
      samples: [3, 3, 2, 5, 6, 6],
      timeDeltas: [1000, 1000, 500, 2000, 4000, 4000],
    };
    const share = profileShare(profile, (url) => url.endsWith('/bridge/rules/engine.js'));
    expect(share).toEqual({
      totalMs: 12.5,
      idleMs: 8,
      matchedMs: 2.5,
      top: [
        { name: 'getVar store.js:264', selfMs: 2 },
        { name: 'onVars engine.js:10', selfMs: 0.5 },
      ],
    });
  });
});
