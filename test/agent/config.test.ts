/**
 * Agent configuration (docs/decisions.md, principle 4): file < `DEVCLOUD_*` environment < flags, defaults filled, every
 * problem reported at once with its key and where the value came from; the real CLI exits 2 on bad config.
 */
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  AGENT_OPTIONS,
  type AgentConfig,
  SERVICE_SOCKET,
  clientSocketPath,
  loadAgentConfig,
  socketPath,
} from '../../agent/config.js';
import { EXIT, runCli } from '../../agent/cli/index.js';
import { ConfigError, parseArgs } from '../../lib/config.js';
import { spawnAgent, tempDir } from '../support/agent.js';

const dir = tempDir('devcloud-config-');
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let fileNo = 0;
function file(content: string, ext = 'yaml'): string {
  const path = join(dir, `agent-${++fileNo}.${ext}`);
  writeFileSync(path, content);
  return path;
}

/** Loads a config the way the CLI does: argv through the shared flag parser, then the loader. */
function load(argv: string[], env: NodeJS.ProcessEnv = {}): AgentConfig {
  const args = parseArgs(argv, AGENT_OPTIONS);
  if (args.problems.length > 0) throw new ConfigError(args.problems);
  return loadAgentConfig({ flags: args.flags, env });
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

const YAML = `
stateDir: /srv/from-file
platform: file-platform
fwVersion: "7"
mqtt:
  url: mqtt://file:1883
  keepaliveSec: 45
udp:
  port: 1000
  dedupeMs: 1234
log:
  level: warn
`;

const JSON_CONFIG = JSON.stringify({
  stateDir: '/srv/from-file',
  platform: 'file-platform',
  fwVersion: '7',
  mqtt: { url: 'mqtt://file:1883', keepaliveSec: 45 },
  udp: { port: 1000, dedupeMs: 1234 },
  log: { level: 'warn' },
});

describe.each([
  ['YAML', YAML, 'yaml'],
  ['JSON', JSON_CONFIG, 'json'],
])('a %s config file', (_kind, content, ext) => {
  it('is read, and keys it does not set keep their defaults', () => {
    const path = file(content, ext);
    const c = load(['--config', path]);
    expect(c).toMatchObject({
      stateDir: '/srv/from-file',
      platform: 'file-platform',
      fwVersion: '7',
      mqtt: { url: 'mqtt://file:1883', keepaliveSec: 45, connectTimeoutMs: 15_000, rejectUnauthorized: true },
      udp: { port: 1000, dedupeMs: 1234, enabled: true },
      log: { level: 'warn', pretty: 'auto' },
    });
  });

  it('is overridden by the environment, which is overridden by flags', () => {
    const path = file(content, ext);
    const env = {
      DEVCLOUD_CONFIG: path,
      DEVCLOUD_MQTT_URL: 'mqtt://env:1883',
      DEVCLOUD_UDP_PORT: '2000',
      DEVCLOUD_LOG_LEVEL: 'error',
      DEVCLOUD_UDP: 'off',
      DEVCLOUD_MQTT_PASSWORD: 'from-env',
    };
    const c = load(['--udp-port', '3000', '--log-level=debug', '--platform', 'flag-platform'], env);
    // file only
    expect(c.fwVersion).toBe('7');
    expect(c.mqtt.keepaliveSec).toBe(45);
    expect(c.stateDir).toBe('/srv/from-file');
    // env over file
    expect(c.mqtt.url).toBe('mqtt://env:1883');
    expect(c.udp.enabled).toBe(false);
    expect(c.mqtt.password).toBe('from-env');
    // flags over env and file
    expect(c.udp.port).toBe(3000);
    expect(c.log.level).toBe('debug');
    expect(c.platform).toBe('flag-platform');
    // a nested sibling from the file survives the override of another key in the same section
    expect(c.udp.dedupeMs).toBe(1234);
  });

  it('named by --config wins over DEVCLOUD_CONFIG', () => {
    const mine = file(content, ext);
    const other = file('platform: other\n');
    expect(load(['--config', mine], { DEVCLOUD_CONFIG: other }).platform).toBe('file-platform');
    expect(load([], { DEVCLOUD_CONFIG: other }).platform).toBe('other');
  });
});

describe('defaults', () => {
  it('fill every section when nothing is given', () => {
    const c = load([]);
    expect(c.stateDir).toBe('/var/lib/devcloud');
    expect(c.mqtt.url).toBe('mqtt://localhost:1883');
    expect(c.mqtt.keepaliveSec).toBe(30);
    expect(c.mqtt.username).toBeUndefined();
    expect(c.mqtt.password).toBeUndefined();
    expect(c.udp).toEqual({ port: 590, enabled: true, dedupeMs: 30_000, maxAgeMs: 300_000, ipv6: true });
    expect(c.socket.mode).toBe('0660');
    expect(c.log).toEqual({ level: 'info', pretty: 'auto' });
    expect(c.store.maxValueBytes).toBe(64 * 1024);
    expect(c.sync.batchSize).toBe(500);
    expect(c.hooks.origins).toEqual(['cloud']);
    expect(c.platform).toMatch(/^linux-/);
  });

  it('take the state directory from systemd, and put the socket in the runtime directory', () => {
    const env = { STATE_DIRECTORY: '/var/lib/devcloud-a:/var/lib/other', RUNTIME_DIRECTORY: '/run/devcloud' };
    const c = load([], env);
    expect(c.stateDir).toBe('/var/lib/devcloud-a');
    expect(socketPath(c, env)).toBe('/run/devcloud/agent.sock');
    expect(socketPath(c, {})).toBe('/var/lib/devcloud-a/agent.sock');
    expect(socketPath(load(['--socket', '/tmp/x.sock']), env)).toBe('/tmp/x.sock');
  });

  it("lead the engineer's CLI to the service's socket from a shell without $RUNTIME_DIRECTORY", () => {
    const installed = load([], {});
    expect(installed.stateDir).toBe('/var/lib/devcloud');
    const there =
      (...paths: string[]) =>
      (p: string) =>
        paths.includes(p);
    // The service runs: its socket is in /run/devcloud, not in the state directory.
    expect(clientSocketPath(installed, {}, there(SERVICE_SOCKET))).toBe(SERVICE_SOCKET);
    // An agent run by hand on the same state directory has its socket there; it is the one asked.
    expect(clientSocketPath(installed, {}, there(SERVICE_SOCKET, '/var/lib/devcloud/agent.sock'))).toBe(
      '/var/lib/devcloud/agent.sock',
    );
    // Neither answers: the agent's own rule, so that "not running" names the usual place.
    expect(clientSocketPath(installed, {}, there())).toBe('/var/lib/devcloud/agent.sock');
    // Another state directory, a configured path or systemd's variable: never the service's socket.
    expect(clientSocketPath(load(['--state-dir', '/srv/a'], {}), {}, there(SERVICE_SOCKET))).toBe('/srv/a/agent.sock');
    expect(clientSocketPath(load(['--socket', '/tmp/x.sock'], {}), {}, there(SERVICE_SOCKET))).toBe('/tmp/x.sock');
    expect(clientSocketPath(installed, { RUNTIME_DIRECTORY: '/run/x' }, there(SERVICE_SOCKET))).toBe(
      '/run/x/agent.sock',
    );
  });

  it('an empty file is no config at all', () => {
    expect(load(['--config', file('')]).udp.port).toBe(590);
  });

  it('the result is frozen all the way down', () => {
    const c = load([]);
    expect(Object.isFrozen(c)).toBe(true);
    expect(Object.isFrozen(c.mqtt)).toBe(true);
    expect(Object.isFrozen(c.hooks.origins)).toBe(true);
    expect(() => {
      (c.mqtt as { url: string }).url = 'mqtt://evil';
    }).toThrow(TypeError);
  });

  it('an empty environment variable is ignored rather than an error', () => {
    expect(load([], { DEVCLOUD_UDP_PORT: '', DEVCLOUD_MQTT_URL: '' }).udp.port).toBe(590);
  });
});

describe('errors', () => {
  it('are all reported at once, each with its key and its source', async () => {
    const path = file(
      ['colour: red', 'mqtt:', '  keepaliveSec: soon', '  bogus: 1', 'udp:', '  port: 70000', ''].join('\n'),
    );
    const env = { DEVCLOUD_CONFIG: path, DEVCLOUD_LOG_LEVEL: 'loud', DEVCLOUD_UDP: 'maybe' };
    const err: string[] = [];
    const code = await runCli(
      ['--mqtt-url', 'nope', '--no-such-flag', 'x'],
      { out: () => undefined, err: (s) => err.push(s) },
      env,
    );
    expect(code).toBe(EXIT.usage);
    const text = err.join('\n');
    const expected = [
      `colour: unknown key (from file ${path})`,
      `mqtt.bogus: unknown key (from file ${path})`,
      new RegExp(`mqtt\\.keepaliveSec: .*\\(from file ${path}\\)`),
      new RegExp(`udp\\.port: .*\\(from file ${path}\\)`),
      /log\.level: .*\(from environment DEVCLOUD_LOG_LEVEL\)/,
      /udp\.enabled: .*\(from environment DEVCLOUD_UDP\)/,
      /mqtt\.url: must be a URL.*\(from flag --mqtt-url\)/,
      'unknown flag --no-such-flag',
    ];
    for (const e of expected) {
      if (typeof e === 'string') expect(text).toContain(e);
      else expect(text).toMatch(e);
    }
    // One line per problem, nothing else reported as a problem.
    expect(text.split('\n').filter((l) => l.startsWith('  - '))).toHaveLength(expected.length);
  });

  it('name the flag that needs a value', () => {
    expect(parseArgs(['--mqtt-url'], AGENT_OPTIONS).problems).toEqual(['flag --mqtt-url needs a value']);
  });

  it('report a value the environment gives in the wrong form with the variable name', () => {
    const problems = problemsOf(() => load([], { DEVCLOUD_UDP_PORT: '59O', DEVCLOUD_LOG_PRETTY: 'sometimes' }));
    expect(problems).toHaveLength(2);
    expect(problems[0]).toMatch(/^(udp\.port|log\.pretty): /);
    expect(problems.join('\n')).toMatch(/udp\.port: .*environment DEVCLOUD_UDP_PORT/);
    expect(problems.join('\n')).toMatch(/log\.pretty: .*environment DEVCLOUD_LOG_PRETTY/);
  });

  it('report a config file that cannot be read', () => {
    const missing = join(dir, 'missing.yaml');
    expect(problemsOf(() => load(['--config', missing]))).toEqual([`config file ${missing}: cannot be read (ENOENT)`]);
    // A directory cannot be read as a file, even by root.
    const folder = join(dir, 'folder.yaml');
    mkdirSync(folder);
    expect(problemsOf(() => load(['--config', folder]))).toEqual([`config file ${folder}: cannot be read (EISDIR)`]);
  });

  it('report a config file that does not parse, together with the other problems', () => {
    const broken = file('mqtt:\n  url: [unclosed\n');
    const problems = problemsOf(() => load(['--config', broken, '--udp-port', 'abc']));
    expect(problems).toHaveLength(2);
    expect(problems[0]).toMatch(new RegExp(`^config file ${broken}: not valid YAML or JSON`));
    expect(problems[1]).toMatch(/^udp\.port: .*flag --udp-port/);
    const badJson = file('{"mqtt": {"url": "mqtt://x:1"}', 'json');
    expect(problemsOf(() => load(['--config', badJson]))[0]).toMatch(/not valid YAML or JSON/);
  });

  it('report a config file whose top level is not a mapping', () => {
    for (const content of ['- a\n- b\n', 'just text\n', '42\n']) {
      const path = file(content);
      expect(problemsOf(() => load(['--config', path]))).toEqual([
        `config file ${path}: the top level must be a mapping of keys`,
      ]);
    }
  });
});

describe('the devcloud-agent process', () => {
  it('exits 2 on bad config and names every bad key on stderr', async () => {
    const p = spawnAgent(['--udp-port', 'abc', '--mqtt-url', 'nope', '--state-dir', dir]);
    let stderr = '';
    p.proc.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    const { code } = await p.exited;
    expect(code).toBe(EXIT.usage);
    expect(stderr).toMatch(/udp\.port: .*\(from flag --udp-port\)/);
    expect(stderr).toMatch(/mqtt\.url: .*\(from flag --mqtt-url\)/);
    expect(stderr).toContain('--help');
  });

  it('prints its usage for --help and exits 0', async () => {
    const p = spawnAgent(['--help']);
    let stdout = '';
    p.proc.stdout?.on('data', (d: Buffer) => (stdout += d.toString()));
    const { code } = await p.exited;
    expect(code).toBe(EXIT.ok);
    for (const flag of ['--config', '--state-dir', '--mqtt-url', '--udp-port', '--socket', '--help']) {
      expect(stdout).toContain(flag);
    }
    // Every flag of the table is documented, with its environment variable.
    for (const o of AGENT_OPTIONS) {
      if (o.flag) expect(stdout).toContain(o.flag);
      if (o.flag && o.env) expect(stdout).toContain(`[${o.env}]`);
    }
  });
});
