/**
 * The agent's `firmware` config section: defaults, its flags and environment variables, and bad values reported
 * as a `ConfigError` (which the CLI turns into exit status 2).
 */
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { AGENT_OPTIONS, type AgentConfig, loadAgentConfig } from '../../agent/config.js';
import { ConfigError, parseArgs } from '../../lib/config.js';
import { tempDir } from '../support/agent.js';

const dir = tempDir('devcloud-fw-config-');
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** No installed config file is found in an empty configuration directory. */
const BASE_ENV: NodeJS.ProcessEnv = { CONFIGURATION_DIRECTORY: dir, STATE_DIRECTORY: '/srv/state' };

function load(argv: string[], env: NodeJS.ProcessEnv = {}): AgentConfig {
  const args = parseArgs(argv, AGENT_OPTIONS);
  if (args.problems.length > 0) throw new ConfigError(args.problems);
  return loadAgentConfig({ flags: args.flags, env: { ...BASE_ENV, ...env } });
}

function problemsOf(fn: () => unknown): readonly string[] {
  try {
    fn();
  } catch (err) {
    if (err instanceof ConfigError) return err.problems;
    throw err;
  }
  throw new Error('expected a ConfigError');
}

let fileNo = 0;
function file(content: string): string {
  const path = join(dir, `fw-${++fileNo}.yaml`);
  writeFileSync(path, content);
  return path;
}

const DEFAULTS = {
  publicKeys: [],
  installer: 'slots',
  health: { timeoutMs: 30_000, retries: 3, intervalMs: 5000, commitTimeoutMs: 300_000 },
  installTimeoutMs: 600_000,
  maxUnpackedBytes: 4 * 1024 ** 3,
  maxFiles: 100_000,
  restart: 'none',
  maxAttempts: 3,
  keepJobs: 20,
};

describe('the firmware config', () => {
  it('has defaults, with no slots folder, health command or URL set', () => {
    const fw = load([]).firmware;
    expect(fw).toEqual(DEFAULTS);
  });

  it('is shown with its defaults in config/agent.example.yaml', () => {
    const example = join(import.meta.dirname, '../../config/agent.example.yaml');
    expect(load(['--config', example]).firmware).toEqual(DEFAULTS);
  });

  it('takes public keys from repeated --fw-public-key flags, or a comma-separated list', () => {
    expect(load(['--fw-public-key', '/etc/k1.pem', '--fw-public-key=/etc/k2.pem']).firmware.publicKeys).toEqual([
      '/etc/k1.pem',
      '/etc/k2.pem',
    ]);
    expect(load(['--fw-public-key', '/etc/k1.pem,/etc/k2.pem']).firmware.publicKeys).toEqual([
      '/etc/k1.pem',
      '/etc/k2.pem',
    ]);
  });

  it('takes the slots folder from --fw-slots and the health command from --fw-health-cmd, split on spaces', () => {
    const fw = load(['--fw-slots', '/data/slots', '--fw-health-cmd', '/usr/bin/check  --quick -t 5']).firmware;
    expect(fw.slotsDir).toBe('/data/slots');
    expect(fw.health.command).toEqual(['/usr/bin/check', '--quick', '-t', '5']);
  });

  it('reads DEVCLOUD_FW_PUBLIC_KEYS, DEVCLOUD_FW_SLOTS and DEVCLOUD_FW_HEALTH_CMD, and flags win over them', () => {
    const env = {
      DEVCLOUD_FW_PUBLIC_KEYS: '/etc/a.pem, /etc/b.pem',
      DEVCLOUD_FW_SLOTS: '/env/slots',
      DEVCLOUD_FW_HEALTH_CMD: '/env/check now',
    };
    const fw = load([], env).firmware;
    expect(fw.publicKeys).toEqual(['/etc/a.pem', '/etc/b.pem']);
    expect(fw.slotsDir).toBe('/env/slots');
    expect(fw.health.command).toEqual(['/env/check', 'now']);
    const flagged = load(['--fw-slots', '/flag/slots', '--fw-public-key', '/flag.pem'], env).firmware;
    expect(flagged.slotsDir).toBe('/flag/slots');
    expect(flagged.publicKeys).toEqual(['/flag.pem']);
  });

  it('reads every key from a file, commands as arrays', () => {
    const path = file(`
firmware:
  publicKeys: [/etc/devcloud/fw1.pem]
  slotsDir: /data/slots
  installer: command
  installCommand: [/usr/sbin/install-fw, --verbose]
  health:
    url: http://localhost:8080/health
    timeoutMs: 1000
    retries: 0
    intervalMs: 0
    commitTimeoutMs: 60000
  installTimeoutMs: 5000
  restart: command
  restartCommand: systemctl restart acme-app
  maxAttempts: 5
  keepJobs: 3
`);
    expect(load(['--config', path]).firmware).toEqual({
      publicKeys: ['/etc/devcloud/fw1.pem'],
      slotsDir: '/data/slots',
      installer: 'command',
      installCommand: ['/usr/sbin/install-fw', '--verbose'],
      health: {
        url: 'http://localhost:8080/health',
        timeoutMs: 1000,
        retries: 0,
        intervalMs: 0,
        commitTimeoutMs: 60_000,
      },
      installTimeoutMs: 5000,
      maxUnpackedBytes: 4 * 1024 ** 3,
      maxFiles: 100_000,
      restart: 'command',
      restartCommand: ['systemctl', 'restart', 'acme-app'],
      maxAttempts: 5,
      keepJobs: 3,
    });
  });

  it('reports bad values with their keys and sources', () => {
    const path = file(`
firmware:
  installer: flash
  health:
    url: ftp://example/health
    retries: -1
  maxAttempts: 0
  colour: blue
`);
    const problems = problemsOf(() => load(['--config', path, '--fw-health-cmd', '   ']));
    expect(problems).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/^firmware\.installer: .*\(from file /),
        expect.stringMatching(/^firmware\.health\.url: must be an http:\/\/ or https:\/\/ URL \(from file /),
        expect.stringMatching(/^firmware\.health\.retries: /),
        expect.stringMatching(/^firmware\.maxAttempts: /),
        expect.stringMatching(/^firmware\.colour: unknown key/),
        expect.stringMatching(/^firmware\.health\.command: must name a command \(from flag --fw-health-cmd\)/),
      ]),
    );
  });

  it('needs an install command for the command installer, and refuses both a health command and a URL', () => {
    expect(problemsOf(() => load([], { DEVCLOUD_CONFIG: file('firmware:\n  installer: command\n') }))).toEqual([
      expect.stringMatching(/^firmware\.installCommand: is needed when installer is "command"/),
    ]);
    expect(problemsOf(() => load([], { DEVCLOUD_CONFIG: file('firmware:\n  restart: command\n') }))).toEqual([
      expect.stringMatching(/^firmware\.restartCommand: is needed when restart is "command"/),
    ]);
    expect(problemsOf(() => load([], { DEVCLOUD_CONFIG: file('firmware:\n  restart: sometimes\n') }))).toEqual([
      expect.stringMatching(/^firmware\.restart: /),
    ]);
    const both = file('firmware:\n  health:\n    command: [/bin/true]\n    url: http://localhost/health\n');
    expect(problemsOf(() => load(['--config', both]))).toEqual([
      expect.stringMatching(/^firmware\.health\.url: set either command or url, not both/),
    ]);
  });
});
