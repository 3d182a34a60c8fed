import { readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { type Socket, createServer } from 'node:net';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { z } from 'zod';
import {
  type Mail,
  type MailConfig,
  MailConfigSchema,
  MailError,
  type Mailer,
  createMailer,
} from '../../bridge/mail/mailer.js';
import { createLogger } from '../../lib/log.js';
import { LogSink, tempDir as makeTempDir } from '../support/agent.js';
import { freePort } from '../support/brokers.js';
import { type TestSmtpServer, parseMessage, startSmtpServer } from '../support/smtp.js';

// Long enough that a quoted-printable body would break it across lines, with `=` that QP would escape.
const LINK = `https://cloud.example.com/0/session/confirm?token=${'a1B2c3D4'.repeat(8)}&app=default`;

function confirmMail(over: Partial<Mail> = {}): Mail {
  return {
    kind: 'confirm',
    to: 'Alice.Example@Mail.Example.org',
    subject: 'Bestätigen Sie Ihre Adresse',
    text: `Hello,\n\nplease confirm your address:\n${LINK}\n\nThe link is valid for 7 days.\n`,
    link: LINK,
    ...over,
  };
}

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function tempDir(): string {
  const dir = makeTempDir('devcloud-mail-');
  cleanups.push(() => Promise.resolve(rmSync(dir, { recursive: true, force: true })));
  return dir;
}

function mailer(config: Partial<z.input<typeof MailConfigSchema>>): { mailer: Mailer; sink: LogSink } {
  const sink = new LogSink();
  const log = createLogger({ level: 'debug', pretty: 'never', base: {}, destination: sink });
  const parsed = MailConfigSchema.parse({ outboxDir: join(tempDir(), 'outbox'), ...config });
  const m = createMailer(parsed, log, Date.now);
  cleanups.push(() => m.close());
  return { mailer: m, sink };
}

async function smtpServer(opts: Parameters<typeof startSmtpServer>[0] = {}): Promise<TestSmtpServer> {
  const server = await startSmtpServer(opts);
  cleanups.push(() => server.close());
  return server;
}

async function rejection(p: Promise<unknown>): Promise<MailError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(MailError);
  return err as MailError;
}

describe('mail over SMTP', () => {
  it('delivers a confirmation with the recipient, the subject and the link intact, and logs no link', async () => {
    const server = await smtpServer();
    const { mailer: m, sink } = mailer({ smtp: { host: '127.0.0.1', port: server.port } });
    expect(m.transport).toBe('smtp');

    await m.send(confirmMail());

    expect(server.messages).toHaveLength(1);
    const msg = server.messages[0]!;
    // nodemailer normalises the domain (IDNA); the local part, which may be case-sensitive, is kept.
    expect(msg.to).toEqual(['Alice.Example@mail.example.org']);
    expect(msg.from).toBe('noreply@localhost');
    expect(msg.headers.get('to')).toBe('Alice.Example@mail.example.org');
    expect(msg.headers.get('from')).toBe('devcloud <noreply@localhost>');
    expect(msg.subject).toBe('Bestätigen Sie Ihre Adresse');
    expect(msg.links).toEqual([LINK]);
    expect(msg.text).toContain('valid for 7 days');

    const sent = sink.events('mail.sent');
    expect(sent).toHaveLength(1);
    expect(sent[0]).toMatchObject({ level: 'info', kind: 'confirm', domain: 'mail.example.org' });
    const logged = sink.text();
    expect(logged).not.toContain('token=');
    expect(logged).not.toContain('a1B2c3D4');
    expect(logged.toLowerCase()).not.toContain('alice.example@');
    expect(sink.events('mail.outbox')).toHaveLength(0);
  });

  it('logs in with user and password when the server requires it, and a wrong password rejects', async () => {
    const server = await smtpServer({ auth: { user: 'bridge', pass: 's3cret-pass' } });
    const good = mailer({ smtp: { host: '127.0.0.1', port: server.port, user: 'bridge', pass: 's3cret-pass' } });
    await good.mailer.send(confirmMail({ kind: 'recover', subject: 'Reset your password' }));
    expect(server.messages).toHaveLength(1);
    expect(server.messages[0]!.user).toBe('bridge');
    expect(server.messages[0]!.subject).toBe('Reset your password');
    expect(good.sink.events('mail.sent')).toEqual([expect.objectContaining({ kind: 'recover' })]);

    const bad = mailer({ smtp: { host: '127.0.0.1', port: server.port, user: 'bridge', pass: 'wrong-pass' } });
    const err = await rejection(bad.mailer.send(confirmMail()));
    expect(err.code).toBe('rejected');
    expect(err.message).toContain('EAUTH');
    expect(server.messages).toHaveLength(1);
    expect(bad.sink.events('mail.sent')).toHaveLength(0);
    expect(bad.sink.events('mail.failed')).toEqual([
      expect.objectContaining({ level: 'warn', code: 'rejected', smtpCode: 'EAUTH', domain: 'mail.example.org' }),
    ]);
    expect(bad.sink.text()).not.toContain('wrong-pass');
    expect(good.sink.text()).not.toContain('s3cret-pass');

    // Without credentials the server refuses the sender: also a rejection, not a silent success.
    const none = mailer({ smtp: { host: '127.0.0.1', port: server.port } });
    expect((await rejection(none.mailer.send(confirmMail()))).code).toBe('rejected');
    expect(server.messages).toHaveLength(1);
  });

  it('rejects at once when nothing listens on the port', async () => {
    const port = await freePort();
    const { mailer: m, sink } = mailer({ smtp: { host: '127.0.0.1', port, timeoutMs: 2000 } });
    const started = Date.now();
    const err = await rejection(m.send(confirmMail()));
    expect(err.code).toBe('unreachable');
    expect(Date.now() - started).toBeLessThan(2000);
    expect(sink.events('mail.failed')).toHaveLength(1);
  });

  it('gives up on a server that accepts the connection but never greets, after timeoutMs', async () => {
    const sockets = new Set<Socket>();
    const silent = createServer((s) => {
      sockets.add(s);
      s.on('error', () => undefined);
    });
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    cleanups.push(async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => silent.close(() => resolve()));
    });
    const port = (silent.address() as { port: number }).port;
    const timeoutMs = 300;
    const { mailer: m } = mailer({ smtp: { host: '127.0.0.1', port, timeoutMs } });

    const started = Date.now();
    const err = await rejection(m.send(confirmMail()));
    const elapsed = Date.now() - started;
    expect(err.code).toBe('unreachable');
    expect(err.message).toContain('ETIMEDOUT');
    expect(sockets.size).toBe(1);
    // The greeting timeout fired (not an immediate failure), and it was ours, not nodemailer's 30 s default.
    expect(elapsed).toBeGreaterThanOrEqual(timeoutMs - 20);
    expect(elapsed).toBeLessThan(5000);
  });

  it('upgrades with STARTTLS, verifying the certificate unless told not to', async () => {
    const server = await smtpServer({ starttls: true });
    const strict = mailer({ smtp: { host: '127.0.0.1', port: server.port } });
    const err = await rejection(strict.mailer.send(confirmMail()));
    expect(err.code).toBe('unreachable');
    expect(server.messages).toHaveLength(0);

    const lax = mailer({ smtp: { host: '127.0.0.1', port: server.port, rejectUnauthorized: false } });
    await lax.mailer.send(confirmMail());
    expect(server.messages).toHaveLength(1);
    expect(server.messages[0]!.secure).toBe(true);
  });

  it('refuses CR or LF in the recipient or the subject, and anything but one bare address', async () => {
    const server = await smtpServer();
    const { mailer: m, sink } = mailer({ smtp: { host: '127.0.0.1', port: server.port } });
    const bad: Array<Partial<Mail>> = [
      { to: 'victim@example.com\r\nBcc: everyone@example.com' },
      { to: 'victim@example.com\nBcc: everyone@example.com' },
      { subject: 'Confirm\r\nBcc: everyone@example.com' },
      { subject: 'Confirm\nX-Injected: 1' },
      { subject: 'Confirm\rX-Injected: 1' },
      { to: 'victim@example.com, everyone@example.com' },
      { to: 'Victim <victim@example.com>' },
      { to: 'not-an-address' },
    ];
    for (const over of bad) {
      const err = await rejection(m.send(confirmMail(over)));
      expect(err.code).toBe('invalid');
    }
    expect(server.messages).toHaveLength(0);
    expect(sink.events('mail.sent')).toHaveLength(0);
  });

  it('refuses to send after close', async () => {
    const server = await smtpServer();
    const { mailer: m } = mailer({ smtp: { host: '127.0.0.1', port: server.port } });
    await m.close();
    expect((await rejection(m.send(confirmMail()))).code).toBe('closed');
  });
});

describe('mail to the outbox folder', () => {
  it('writes a readable .eml with mode 0600 in a 0700 folder and logs the link once', async () => {
    const outboxDir = join(tempDir(), 'data', 'outbox');
    const { mailer: m, sink } = mailer({ outboxDir });
    expect(m.transport).toBe('outbox');

    await m.send(confirmMail());

    expect(statSync(outboxDir).mode & 0o777).toBe(0o700);
    const files = readdirSync(outboxDir);
    expect(files).toHaveLength(1);
    const file = join(outboxDir, files[0]!);
    expect(file).toMatch(/\.eml$/);
    expect(statSync(file).mode & 0o777).toBe(0o600);

    const raw = readFileSync(file, 'utf8');
    // The link is in the file verbatim, so a developer can copy it from the text.
    expect(raw).toContain(LINK);
    const msg = parseMessage(raw, { from: '', to: [], secure: false });
    expect(msg.headers.get('from')).toBe('devcloud <noreply@localhost>');
    expect(msg.headers.get('to')).toBe('Alice.Example@Mail.Example.org');
    expect(msg.subject).toBe('Bestätigen Sie Ihre Adresse');
    expect(msg.headers.get('message-id')).toMatch(/^<[^<>@\s]+@localhost>$/);
    const date = msg.headers.get('date') ?? '';
    expect(date).toMatch(/^[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} \+0000$/);
    expect(Math.abs(Date.parse(date) - Date.now())).toBeLessThan(60_000);
    expect(msg.text).toBe(confirmMail().text.replace(/\n/g, '\r\n'));
    // Header lines stay ASCII: the subject went out as encoded words.
    expect(raw.slice(0, raw.indexOf('\r\n\r\n'))).toMatch(/^[\x20-\x7e\r\n]*$/);

    const outbox = sink.events('mail.outbox');
    expect(outbox).toHaveLength(1);
    expect(outbox[0]).toMatchObject({ level: 'info', kind: 'confirm', file, link: LINK });
    expect(sink.events('mail.sent')).toHaveLength(0);
  });

  it('names the files so that they sort in the order sent, and leaves no temporary files', async () => {
    const outboxDir = join(tempDir(), 'outbox');
    const { mailer: m, sink } = mailer({ outboxDir });
    const subjects = Array.from({ length: 12 }, (_, i) => `Message ${String.fromCharCode(76 - i)}`);
    // A frozen clock: the first six share one millisecond, so only the name's counter can order them.
    vi.useFakeTimers({ toFake: ['Date'], now: new Date('2026-03-01T12:00:00.000Z') });
    try {
      for (const [i, subject] of subjects.entries()) {
        if (i === 6) vi.setSystemTime(new Date('2026-03-01T12:00:01.000Z'));
        await m.send(confirmMail({ subject, kind: 'recover' }));
      }
    } finally {
      vi.useRealTimers();
    }

    const files = readdirSync(outboxDir).sort();
    expect(files).toHaveLength(12);
    expect(files.every((f) => /^[^.].*-recover-[0-9a-f]+\.eml$/.test(f))).toBe(true);
    const inOrder = files.map(
      (f) => parseMessage(readFileSync(join(outboxDir, f), 'utf8'), { from: '', to: [], secure: false }).subject,
    );
    expect(inOrder).toEqual(subjects);
    expect(sink.events('mail.outbox')).toHaveLength(12);
  });

  it('rejects with MailError when the outbox cannot be created', async () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'data'), 'a file where a folder should be');
    const { mailer: m, sink } = mailer({ outboxDir: join(dir, 'data', 'outbox') });
    const err = await rejection(m.send(confirmMail()));
    expect(err.code).toBe('outbox');
    expect(sink.events('mail.outbox')).toHaveLength(0);
    expect(sink.events('mail.failed')).toHaveLength(1);
  });

  it('refuses CR or LF in the recipient or the subject and writes nothing', async () => {
    const outboxDir = join(tempDir(), 'outbox');
    const { mailer: m, sink } = mailer({ outboxDir });
    for (const over of [{ to: 'a@example.com\r\nBcc: b@example.com' }, { subject: 'Hi\nBcc: b@example.com' }]) {
      expect((await rejection(m.send(confirmMail(over)))).code).toBe('invalid');
    }
    expect(() => readdirSync(outboxDir)).toThrow();
    expect(sink.events('mail.outbox')).toHaveLength(0);
  });
});

describe('mail configuration', () => {
  it('fills the defaults and rejects unknown keys, half a login and a multi-line sender', () => {
    const config: MailConfig = MailConfigSchema.parse({ outboxDir: '/x', smtp: { host: 'smtp.example.com' } });
    expect(config).toEqual({
      from: 'devcloud <noreply@localhost>',
      outboxDir: '/x',
      smtp: { host: 'smtp.example.com', port: 587, secure: false, rejectUnauthorized: true, timeoutMs: 10_000 },
    });
    expect(MailConfigSchema.parse({ outboxDir: '/x' })).toEqual({
      from: 'devcloud <noreply@localhost>',
      outboxDir: '/x',
    });
    expect(MailConfigSchema.safeParse({}).success).toBe(false);
    expect(MailConfigSchema.safeParse({ outboxDir: '/x', extra: 1 }).success).toBe(false);
    expect(MailConfigSchema.safeParse({ outboxDir: '/x', smtp: { host: 'h', tls: true } }).success).toBe(false);
    const half = MailConfigSchema.safeParse({ outboxDir: '/x', smtp: { host: 'h', user: 'u' } });
    expect(half.success).toBe(false);
    expect(half.error?.issues[0]?.path).toEqual(['smtp', 'pass']);
    expect(MailConfigSchema.safeParse({ outboxDir: '/x', from: 'a@b\r\nBcc: c@d' }).success).toBe(false);
  });
});
