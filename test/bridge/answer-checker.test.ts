/**
 * The answer checker (`bridge/http/checker.ts`): with `checkAnswers` on, every answer is held to what its route
 * declares, and one that is not documented becomes 500 `undocumented-answer`, logged as `http.undocumented_answer`.
 * The test suite's bridges run with it on, so this is what makes every HTTP test also a test of the API document.
 * Here a route declares a few outcomes and answers, on request, each thing the checker must refuse.
 */
import { rmSync } from 'node:fs';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { BridgeConfigSchema } from '../../bridge/config.js';
import { sendJson } from '../../bridge/http/reply.js';
import { type Route, named } from '../../bridge/http/route.js';
import { createServer } from '../../bridge/http/server.js';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, tempDir } from '../support/agent.js';

const Thing = z.object({ name: z.string() });

/** What the route answers for `?what=…`. */
const ANSWERS: Record<string, (reply: Parameters<Route['handler']>[1]) => unknown> = {
  token: (r) => r.code(200).type('text/plain; charset=utf-8').send('ok'),
  json: (r) => sendJson(r, '{"name":"a"}', 201),
  empty: (r) => r.code(204).send(),
  later: (r) => r.code(429).header('retry-after', 2).type('text/plain; charset=utf-8').send('later'),
  'other-token': (r) => r.code(200).type('text/plain; charset=utf-8').send('not-ok'),
  'other-status': (r) => r.code(202).type('text/plain; charset=utf-8').send('ok'),
  'json-wrong-shape': (r) => sendJson(r, '{"name":1}', 201),
  'json-unknown-key': (r) => sendJson(r, '{"name":"a","extra":true}', 201),
  'json-not-json': (r) => sendJson(r, '{"name":', 201),
  'json-where-a-token-is': (r) => sendJson(r, '"ok"'),
  'html-where-json-is': (r) => r.code(201).type('text/html; charset=utf-8').send('<p>'),
  'a-body-where-none-is': (r) => r.code(204).type('text/plain; charset=utf-8').send('x'),
  'undocumented-header': (r) => r.code(200).header('retry-after', 1).type('text/plain; charset=utf-8').send('ok'),
  'documented-header-missing': (r) => r.code(429).type('text/plain; charset=utf-8').send('later'),
  'retry-after-zero': (r) => r.code(429).header('retry-after', 0).type('text/plain; charset=utf-8').send('later'),
};

const route: Route = {
  method: 'GET',
  path: '/test/answer',
  operationId: 'answer',
  tag: 'Meta',
  summary: 'answers what it is asked',
  description: '',
  device: true,
  responses: {
    200: { description: 'a token', tokens: ['ok'] },
    201: { description: 'JSON', json: named('Thing', Thing) },
    204: { description: 'no body' },
    429: { description: 'later', tokens: ['later'], retryAfter: true },
  },
  handler: async (req, reply) => ANSWERS[(req.query as { what: string }).what]!(reply),
};

describe('the answer checker', () => {
  let app: FastifyInstance;
  let store: SqliteStore;
  const sink = new LogSink();
  const dataDir = tempDir('devcloud-checker-');

  beforeAll(async () => {
    const config = BridgeConfigSchema.parse({ dataDir });
    const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
    store = new SqliteStore(dataDir);
    const server = createServer({ config, store, log, now: Date.now, checkAnswers: true });
    server.register([route]);
    app = server.app;
    await app.ready();
  });

  afterAll(async () => {
    await app?.close();
    await store?.close();
    rmSync(dataDir, { recursive: true, force: true });
  });

  const ask = (what: string) => app.inject({ method: 'GET', url: `/test/answer?what=${what}` });

  it('lets documented answers through unchanged', async () => {
    expect([(await ask('token')).statusCode, (await ask('token')).body]).toEqual([200, 'ok']);
    const json = await ask('json');
    expect([json.statusCode, json.json()]).toEqual([201, { name: 'a' }]);
    expect((await ask('empty')).statusCode).toBe(204);
    expect((await ask('later')).headers['retry-after']).toBe('2');
    // HEAD answers as GET does.
    expect((await app.inject({ method: 'HEAD', url: '/test/answer?what=token' })).statusCode).toBe(200);
    expect(sink.lines.filter((l) => l.event === 'http.undocumented_answer')).toEqual([]);
  });

  for (const what of Object.keys(ANSWERS).slice(4)) {
    it(`replaces ${what} with 500 undocumented-answer, and logs it`, async () => {
      const before = sink.lines.length;
      const r = await ask(what);
      expect([r.statusCode, r.body, r.headers['content-type']]).toEqual([
        500,
        'undocumented-answer',
        'text/plain; charset=utf-8',
      ]);
      expect(r.headers['retry-after']).toBeUndefined();
      const logged = sink.lines.slice(before).filter((l) => l.event === 'http.undocumented_answer');
      expect(logged).toEqual([
        expect.objectContaining({ level: 'error', route: '/test/answer', method: 'GET', detail: expect.any(String) }),
      ]);
    });
  }

  it('leaves requests no route matched alone', async () => {
    const r = await app.inject({ method: 'GET', url: '/nowhere' });
    expect([r.statusCode, r.body]).toEqual([404, 'not found']);
  });
});
