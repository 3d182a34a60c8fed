/**
 * Commands end to end through a listening bridge, its embedded broker and a real agent: a built-in, an
 * executable handler from the commands folder, and an unknown command.
 */
import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type HttpClient, type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { until } from '../support/wait.js';

interface Cmd {
  state: string;
  output: string | null;
  exitCode: number | null;
  reason: string | null;
}

describe('commands through a real bridge and agent', () => {
  let bridge: LiveBridge | undefined;
  let agent: TestAgent | undefined;
  afterEach(async () => {
    await agent?.stop();
    await bridge?.close();
  });

  async function owned(): Promise<{ http: HttpClient; id: string }> {
    bridge = await startLiveBridge();
    const dir = tempDir();
    const handlers = join(dir, 'handlers');
    mkdirSync(handlers);
    writeFileSync(join(handlers, 'greet'), '#!/bin/sh\necho "hello $1"\n');
    chmodSync(join(handlers, 'greet'), 0o755);
    agent = await startAgent({ mqttUrl: bridge.mqttUrl, flags: { 'commands.dir': handlers } });
    const id = agent.agent.identity.deviceId;
    await until(async () => (await bridge!.bridge.store.devices.device(id))?.authcode ?? undefined, 'the hello');
    const http = bridge.client();
    await http.post('/0/session/signup', { form: { login: 'cmd@example.com', password: 'correct horse battery' } });
    const claim = await http.post('/0/devices/', { form: { auth: agent.agent.identity.authcode } });
    expect(claim.status).toBe(201);
    return { http, id };
  }

  async function finished(http: HttpClient, id: string, cmd: string): Promise<Cmd> {
    return until(async () => {
      const r = await http.get(`/0/devices/${id}/commands/${cmd}`);
      const c = JSON.parse(r.body) as Cmd;
      return ['done', 'failed', 'expired'].includes(c.state) ? c : undefined;
    }, `command ${cmd} to finish`);
  }

  it('runs ping, an executable handler and reports an unknown command as failed', async () => {
    const { http, id } = await owned();
    const ping = await http.post(`/0/devices/${id}/`, { form: { command: 'ping' } });
    expect(ping.status).toBe(200);
    expect(await finished(http, id, ping.body)).toMatchObject({ state: 'done', output: 'pong' });

    const greet = await http.post(`/0/devices/${id}/`, { form: { command: 'greet world', priority: '1' } });
    expect(await finished(http, id, greet.body)).toMatchObject({ state: 'done', output: 'hello world\n', exitCode: 0 });

    const nope = await http.post(`/0/devices/${id}/`, { form: { command: 'nope' } });
    const failed = await finished(http, id, nope.body);
    expect(failed.state).toBe('failed');
    expect(failed.reason).toMatch(/unknown command nope/);

    const list = JSON.parse((await http.get(`/0/devices/${id}/commands/`)).body) as Array<{ id: string }>;
    expect(list.map((c) => c.id)).toEqual([nope.body, greet.body, ping.body]);
  });
});
