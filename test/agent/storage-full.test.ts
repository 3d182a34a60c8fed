/**
 * A full disk under a real agent process: its state directory is a small tmpfs, filled up with one file. A change
 * over the local socket answers `storage-full` (not `internal`), reads go on, `devcloud-agent doctor` says why,
 * and once the file is removed changes work again without a restart.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../../agent/cli/index.js';
import { LocalClientError, type LocalClient } from '../../agent/local/client.js';
import { type AgentProcess, spawnAgent, tempDir, waitForSocket } from '../support/agent.js';
import { type TestBroker, startAedes } from '../support/brokers.js';
import { type SmallDisk, smallDiskOrSkip } from '../support/tmpfs.js';

const mounted = smallDiskOrSkip(16 * 1024 * 1024, 'the full-disk tests of the agent');

async function doctor(stateDir: string, mqttUrl: string): Promise<{ code: number; out: string }> {
  const out: string[] = [];
  const code = await runCli(
    ['doctor', '--state-dir', stateDir, '--mqtt-url', mqttUrl, '--udp', 'false'],
    { out: (s) => out.push(s), err: (s) => out.push(s) },
    // An empty configuration folder: the machine's own /etc/devcloud stays out of it.
    { CONFIGURATION_DIRECTORY: tempDir('devcloud-etc-') },
  );
  return { code, out: out.join('\n') };
}

/** The error code of a refused request, or `ok`. */
async function outcome(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'ok';
  } catch (err) {
    if (err instanceof LocalClientError) return err.code;
    throw err;
  }
}

describe.skipIf(mounted === undefined)('a full disk under the agent', () => {
  let broker: TestBroker;
  let agent: AgentProcess;
  let local: LocalClient;
  const d = mounted!;

  beforeAll(async () => {
    broker = await startAedes();
    agent = spawnAgent(['run', '--state-dir', d.dir, '--mqtt-url', broker.url, '--udp', 'false']);
    local = await waitForSocket(agent.socket);
  });
  afterAll(async () => {
    local?.close();
    await agent?.kill9();
    await broker?.close();
    (d as SmallDisk | undefined)?.unmount();
  });

  it('answers storage-full, keeps serving reads, tells doctor, and recovers by itself', async () => {
    await local.set('d', 'before', 'kept');
    d.fill();
    // SQLite reuses the space its log file already holds: changes go on until that is used up too.
    const value = randomBytes(24 * 1024).toString('hex');
    let refused = 'ok';
    for (let i = 0; i < 500 && refused === 'ok'; i++) refused = await outcome(local.set('d', `big${i}`, value));
    expect(refused).toBe('storage-full');
    expect(await outcome(local.set('d', 'small', 'x'))).toBe('storage-full');

    // Reads are served.
    expect((await local.list('d')).find((v) => v.name === 'before')?.value).toBe('kept');
    expect((await local.get('d', 'before')).value).toBe('kept');

    const full = await doctor(d.dir, broker.url);
    expect(full.code, full.out).toBe(1);
    expect(full.out).toMatch(/^FAIL storage full: the agent's writes fail for lack of space/m);

    d.free();
    expect(await outcome(local.set('d', 'after', 'written'))).toBe('ok');
    expect((await local.get('d', 'after')).value).toBe('written');
    const healthy = await doctor(d.dir, broker.url);
    expect(healthy.out).toMatch(/^OK {3}storage: the agent's last writes succeeded$/m);
    expect(healthy.out).not.toMatch(/^FAIL storage/m);

    const events = agent
      .output()
      .split('\n')
      .filter((l) => l.includes('"event":"storage.'))
      .map((l) => (JSON.parse(l) as { event: string }).event);
    expect(events).toEqual(['storage.full', 'storage.recovered']);
    // Not one `local.failed` per refused request: the one `storage.full` says it.
    expect(agent.output()).not.toContain('"event":"local.failed"');
  });
});
