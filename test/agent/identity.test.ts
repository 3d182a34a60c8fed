/**
 * The device identity (docs/decisions.md §5): made at first start or taken from a provisioning file, kept in
 * `<stateDir>/identity.json` readable by the agent only, the same across restarts; a bad file stops the agent
 * with a clear error rather than making a new identity behind the operator's back.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { chmodSync, existsSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Identity, IdentityError, identityPath, loadIdentity } from '../../agent/identity.js';
import { type TestBroker, startBroker } from '../support/brokers.js';
import { FakeCloud } from '../support/fake-cloud.js';
import { type TestAgent, spawnAgent, startAgent, tempDir, waitForSocket } from '../support/agent.js';

const dirs: string[] = [];
function fresh(): string {
  const d = tempDir('devcloud-identity-');
  dirs.push(d);
  return d;
}
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const modeOf = (path: string) => statSync(path).mode & 0o777;

function provisioned(over: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    deviceId: randomUUID(),
    secret: randomBytes(24).toString('hex'),
    authcode: randomBytes(16).toString('hex'),
    ...over,
  };
}

function writeJson(path: string, value: unknown): string {
  writeFileSync(path, JSON.stringify(value));
  return path;
}

function identityError(fn: () => unknown): IdentityError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(IdentityError);
    return err as IdentityError;
  }
  throw new Error('expected an IdentityError');
}

describe('loadIdentity', () => {
  it('makes an identity at first start and stores it with mode 0600', () => {
    const dir = fresh();
    const { identity, source } = loadIdentity(dir, undefined);
    expect(source).toBe('generated');
    expect(Identity.parse(identity)).toEqual(identity);
    expect(identity.secret.length).toBeGreaterThanOrEqual(32);
    expect(identity.authcode).toMatch(/^[0-9a-f]{32}$/);
    const path = identityPath(dir);
    expect(path).toBe(join(dir, 'identity.json'));
    expect(modeOf(path)).toBe(0o600);
    expect(JSON.parse(readFileSync(path, 'utf8'))).toEqual(identity);
    // Written atomically: no temporary file left beside it.
    expect(readdirSync(dir)).toEqual(['identity.json']);
  });

  it('keeps the same identity on every later start', () => {
    const dir = fresh();
    const first = loadIdentity(dir, undefined).identity;
    const again = loadIdentity(dir, undefined);
    expect(again).toEqual({ identity: first, source: 'state' });
    // Two devices never get the same identity.
    const other = loadIdentity(fresh(), undefined).identity;
    expect(other.deviceId).not.toBe(first.deviceId);
    expect(other.secret).not.toBe(first.secret);
    expect(other.authcode).not.toBe(first.authcode);
  });

  it('puts the mode back to 0600 if someone loosened it', () => {
    const dir = fresh();
    loadIdentity(dir, undefined);
    chmodSync(identityPath(dir), 0o644);
    loadIdentity(dir, undefined);
    expect(modeOf(identityPath(dir))).toBe(0o600);
  });

  it('creates a missing state directory', () => {
    const dir = join(fresh(), 'nested', 'state');
    loadIdentity(dir, undefined);
    expect(modeOf(identityPath(dir))).toBe(0o600);
  });

  it('takes the identity from a provisioning file, which may carry more', () => {
    const dir = fresh();
    const prov = provisioned({ mqttUrl: 'mqtts://broker.example:8883' });
    const file = writeJson(join(fresh(), 'device.json'), prov);
    const { identity, source } = loadIdentity(dir, file);
    expect(source).toBe('provisioned');
    expect(identity).toEqual({ deviceId: prov.deviceId, secret: prov.secret, authcode: prov.authcode });
    expect(JSON.parse(readFileSync(identityPath(dir), 'utf8'))).toEqual(identity);
    expect(modeOf(identityPath(dir))).toBe(0o600);
  });

  it('reads the provisioning file only at first start', () => {
    const dir = fresh();
    const first = loadIdentity(dir, writeJson(join(fresh(), 'a.json'), provisioned())).identity;
    // Another file, or one that is gone, changes nothing once the identity is stored.
    expect(loadIdentity(dir, writeJson(join(fresh(), 'b.json'), provisioned())).identity).toEqual(first);
    expect(loadIdentity(dir, join(dir, 'gone.json')).identity).toEqual(first);
  });

  it.each([
    ['not JSON', 'identity'],
    ['empty', ''],
    ['JSON that is not an object', '[1,2,3]'],
  ])('refuses an identity file that is %s, and leaves it as it is', (_what, content) => {
    const dir = fresh();
    writeFileSync(identityPath(dir), content);
    const err = identityError(() => loadIdentity(dir, undefined));
    expect(err.name).toBe('IdentityError');
    expect(err.message).toContain(identityPath(dir));
    // A broken identity is never silently replaced by a new one: the cloud knows the device by it.
    expect(readFileSync(identityPath(dir), 'utf8')).toBe(content);
  });

  it.each([
    ['a device id that is not a uuid', { deviceId: 'gateway-1' }, 'deviceId'],
    ['a short secret', { secret: 'short' }, 'secret'],
    ['an upper-case auth code', { authcode: 'ABCDEF0123456789' }, 'authcode'],
    ['a missing auth code', { authcode: undefined }, 'authcode'],
    ['an unknown key', { extra: 1 }, 'extra'],
  ])('refuses an identity file with %s and names the key', (_what, over, key) => {
    const dir = fresh();
    writeJson(identityPath(dir), provisioned(over));
    const err = identityError(() => loadIdentity(dir, undefined));
    expect(err.message).toMatch(new RegExp(`^identity file ${identityPath(dir)} is invalid: .*${key}`));
  });

  it('never quotes the secret of a corrupt file in its message', () => {
    const dir = fresh();
    const secret = randomBytes(24).toString('hex');
    // An unquoted value makes V8 quote the text around it in its own message.
    writeFileSync(identityPath(dir), `{"deviceId":"${randomUUID()}","secret":${secret}}`);
    const err = identityError(() => loadIdentity(dir, undefined));
    expect(err.message).toMatch(/not valid JSON/);
    expect(err.message).not.toContain(secret.slice(0, 6));
  });

  it('refuses a provisioning file that is missing, not JSON or invalid, and stores nothing', () => {
    const dir = fresh();
    const missing = join(dir, 'missing.json');
    expect(identityError(() => loadIdentity(dir, missing)).message).toMatch(
      new RegExp(`^provisioning file ${missing} cannot be read: .*ENOENT`),
    );
    const notJson = join(dir, 'garbage.json');
    writeFileSync(notJson, 'deviceId=1');
    expect(identityError(() => loadIdentity(dir, notJson)).message).toMatch(/cannot be read: not valid JSON/);
    const bad = writeJson(join(dir, 'bad.json'), provisioned({ deviceId: 42 }));
    expect(identityError(() => loadIdentity(dir, bad)).message).toMatch(
      new RegExp(`^provisioning file ${bad} is invalid: deviceId`),
    );
    expect(existsSync(identityPath(dir))).toBe(false);
  });
});

describe('the agent and its identity', () => {
  let broker: TestBroker;
  let cloud: FakeCloud;
  let agent: TestAgent | undefined;

  beforeAll(async () => {
    broker = await startBroker('aedes');
    cloud = await FakeCloud.start(broker.url);
  });
  afterEach(async () => {
    await agent?.stop();
    agent = undefined;
  });
  afterAll(async () => {
    await cloud?.close();
    await broker?.close();
  });

  it('introduces itself with the same identity after a restart', async () => {
    const stateDir = fresh();
    agent = await startAgent({ mqttUrl: broker.url, stateDir });
    const id = agent.agent.identity;
    expect(agent.sink.events('agent.identity')[0]).toMatchObject({ source: 'generated', deviceId: id.deviceId });
    await cloud.until(() => cloud.device(id.deviceId).hellos.length === 1, 'first hello');
    await agent.stop();

    agent = await startAgent({ mqttUrl: broker.url, stateDir });
    expect(agent.agent.identity).toEqual(id);
    expect(agent.sink.events('agent.identity')[0]).toMatchObject({ source: 'state', deviceId: id.deviceId });
    await cloud.until(() => cloud.device(id.deviceId).hellos.length === 2, 'second hello');
    for (const hello of cloud.device(id.deviceId).hellos) {
      expect(hello).toMatchObject({ deviceId: id.deviceId, authcode: id.authcode });
    }
  });

  it('runs with a provisioned identity given by --provision', async () => {
    const stateDir = fresh();
    const prov = provisioned();
    const file = writeJson(join(fresh(), 'device.json'), prov);
    const p = spawnAgent([
      'run',
      '--state-dir',
      stateDir,
      '--provision',
      file,
      '--mqtt-url',
      broker.url,
      '--udp-port',
      '0',
      '--log-pretty',
      'never',
    ]);
    try {
      const client = await waitForSocket(p.socket, 30_000);
      const status = await client.status();
      client.close();
      expect(status.deviceId).toBe(prov.deviceId);
      await cloud.until(() => cloud.device(prov.deviceId as string).hellos.length > 0, 'hello');
      expect(cloud.device(prov.deviceId as string).hellos[0]!.authcode).toBe(prov.authcode);
      expect(modeOf(identityPath(stateDir))).toBe(0o600);
      p.proc.kill('SIGTERM');
      expect((await p.exited).code).toBe(0);
    } finally {
      await p.kill9();
    }
    expect(p.output()).toContain('"source":"provisioned"');
  });

  it.each([
    ['a corrupt identity file', 'identity'],
    ['an invalid provisioning file', 'provisioning'],
  ])('the process exits non-zero with agent.start_failed on %s', async (_what, which) => {
    const stateDir = fresh();
    const args = ['--state-dir', stateDir, '--mqtt-url', broker.url, '--udp-port', '0', '--log-pretty', 'never'];
    if (which === 'identity') writeFileSync(identityPath(stateDir), '{"deviceId": ');
    else args.push('--provision', writeJson(join(fresh(), 'device.json'), provisioned({ secret: 'short' })));
    const p = spawnAgent(args);
    const { code } = await p.exited;
    expect(code).toBe(1);
    const lines = p
      .output()
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    const failed = lines.find((l) => l.event === 'agent.start_failed');
    expect(failed, p.output()).toBeDefined();
    expect(failed!.level).toBe('fatal');
    expect(String(failed!.err)).toMatch(which === 'identity' ? /identity file .* not valid JSON/ : /secret/);
    // Nothing was made in place of the bad identity, and nothing ran.
    expect(existsSync(join(stateDir, 'agent.sock'))).toBe(false);
    if (which === 'provisioning') expect(existsSync(identityPath(stateDir))).toBe(false);
  });
});
