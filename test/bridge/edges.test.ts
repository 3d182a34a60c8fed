/**
 * Edges found in review: a frontend parameter that cannot name one frontend, a recovery token presented for the
 * wrong login, and the removal of expired sessions.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { SqliteStore } from '../../bridge/store/sqlite.js';
import { type TestBridge, startTestBridge } from '../support/bridge.js';

const PASSWORD = 'correct horse battery';

describe('bridge edges', () => {
  let b: TestBridge;
  afterEach(async () => b?.close());

  it('answers 404 for an app parameter given twice or not as text, instead of using the default frontend', async () => {
    b = await startTestBridge();
    const f = await b.addFrontend();
    const c = b.client();
    expect((await c.post(`/0/session/?app=${f.id}&app=${f.id}`)).status).toBe(404);
    expect((await c.post('/0/session/', { json: { app: [f.id] } })).status).toBe(404);
    expect((await c.post('/0/session/', { json: { app: 5 } })).status).toBe(404);
    // One string still works, and no parameter still means the default frontend.
    expect((await c.post(`/0/session/?app=${f.id}`)).status).toBe(201);
    expect((await b.client().post('/0/session/')).status).toBe(201);
  });

  it('keeps a recovery token usable by its owner when it is presented with another login', async () => {
    b = await startTestBridge();
    for (const login of ['ann@example.com', 'bob@example.com']) {
      const res = await b.client().post('/0/session/signup', { form: { login, password: PASSWORD } });
      expect(res.status).toBe(201);
    }
    const c = b.client();
    expect((await c.post('/0/session/recover', { form: { login: 'ann@example.com' } })).status).toBe(200);
    const line = b.sink.events('mail.outbox').find((l) => String(l.link).includes('recover'));
    const token = new URL(String(line?.link)).searchParams.get('token')!;
    // Bob cannot use Ann's token, and trying does not burn it.
    const wrong = await c.post('/0/session/recover', {
      form: { login: 'bob@example.com', token, password: 'new password 1' },
    });
    expect(wrong.body).toBe('recover-fail');
    const right = await c.post('/0/session/recover', {
      form: { login: 'ann@example.com', token, password: 'new password 2' },
    });
    expect(right.body).toBe('recover-ok');
    const login = await b
      .client()
      .post('/0/session/login', { form: { login: 'ann@example.com', password: 'new password 2' } });
    expect(login.body).toBe('login-ok');
  });

  it('sees a frontend changed by another process (the admin CLI) without a restart', async () => {
    b = await startTestBridge();
    const f = await b.addFrontend({ confirmationEmail: true });
    const c = b.client();
    expect(
      (await c.post(`/0/session/signup?app=${f.id}`, { form: { login: 'a@example.com', password: PASSWORD } })).status,
    ).toBe(201);
    expect(b.sink.events('mail.outbox')).toHaveLength(1);
    // The CLI opens the same database in its own process; a second store stands for it here.
    const cli = new SqliteStore(b.dataDir);
    await cli.setFrontendConfig(f.id, { ...f.config, confirmationEmail: false });
    await cli.close();
    // The bridge checks for such changes at most once a second: wait, on the real clock, until it sees it.
    const deadline = Date.now() + 10_000;
    while ((await b.store.frontend(f.id))?.config.confirmationEmail !== false) {
      if (Date.now() > deadline) throw new Error('the change was never seen');
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(
      (await b.client().post(`/0/session/signup?app=${f.id}`, { form: { login: 'b@example.com', password: PASSWORD } }))
        .status,
    ).toBe(201);
    expect(b.sink.events('mail.outbox')).toHaveLength(1);
  });

  it('prunes sessions past their idle time or their lifetime, and keeps live ones', async () => {
    b = await startTestBridge();
    const day = 86_400_000;
    const t0 = b.clock.now();
    const live = b.client();
    await live.post('/0/session/');
    const idle = b.client();
    await idle.post('/0/session/');
    b.clock.advance(20 * day);
    await live.post('/0/session/');
    b.clock.advance(15 * day);
    // idle was last seen 35 days ago; live 15 days ago.
    const removed = await b.store.write((tx) =>
      tx.pruneSessions(b.clock.now() - b.config.sessions.idleDays * day, t0 - 1),
    );
    expect(removed).toBe(1);
    expect((await live.post('/0/session/')).body).toBe('user-ok');
    expect((await live.post('/0/session/')).status).toBe(200);
    expect((await idle.post('/0/session/')).status).toBe(201);
  });
});
