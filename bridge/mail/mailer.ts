/**
 * The bridge's outgoing e-mail (decision 20): confirmation and password-reset links. Over SMTP with
 * nodemailer when `smtp` is configured; otherwise each message is written to an outbox folder as a `.eml` file
 * and its link is logged, which is what a developer running the bridge locally clicks.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import nodemailer from 'nodemailer';
import { encodeWords } from 'nodemailer/lib/mime-funcs';
import { z } from 'zod';
import { writeFileAtomic } from '../../lib/fsutil.js';
import type { Logger } from '../../lib/log.js';

/** A header value must stay on one line: CR or LF would let a caller add headers (header injection). */
const HEADER_BREAK = /[\r\n\0]/;

export const MailConfigSchema = z
  .object({
    /** Sender of every message, `Name <address>` or a bare address. */
    from: z
      .string()
      .min(1)
      .max(998)
      .refine((s) => !HEADER_BREAK.test(s), 'must be a single line')
      .default('devcloud <noreply@localhost>'),
    /** Where messages go when no SMTP server is configured; the bridge passes `<dataDir>/outbox`. */
    outboxDir: z.string().min(1),
    /** The SMTP relay; when absent, messages go to the outbox. */
    smtp: z
      .object({
        host: z.string().min(1),
        port: z.number().int().min(1).max(65535).default(587),
        /** TLS from the first byte (port 465); false: plain, upgraded with STARTTLS when the server offers it. */
        secure: z.boolean().default(false),
        user: z.string().min(1).optional(),
        pass: z.string().min(1).optional(),
        /** Verify the server's certificate; turn off only for a relay with a self-signed certificate. */
        rejectUnauthorized: z.boolean().default(true),
        /** Connection, greeting and inactivity timeout, in milliseconds. */
        timeoutMs: z.number().int().min(50).max(600_000).default(10_000),
      })
      .strict()
      .superRefine((smtp, ctx) => {
        if ((smtp.user === undefined) !== (smtp.pass === undefined)) {
          ctx.addIssue({
            code: 'custom',
            path: [smtp.user === undefined ? 'user' : 'pass'],
            message: 'user and pass go together',
          });
        }
      })
      .optional(),
  })
  .strict();

export type MailConfig = z.infer<typeof MailConfigSchema>;

export interface Mail {
  /** `notification`: a rule fired (docs/notifications.md, "Delivery"). */
  kind: 'confirm' | 'recover' | 'notification';
  /** One bare address, `local@domain`. */
  to: string;
  subject: string;
  text: string;
  /** The link inside `text`; logged in outbox mode only (none in a notification). */
  link: string;
}

export interface Mailer {
  readonly transport: 'smtp' | 'outbox';
  /** Resolves once the SMTP server accepted the message or the outbox file is on disk; else a MailError. */
  send(mail: Mail): Promise<void>;
  close(): Promise<void>;
}

export const MAIL_ERROR_CODES = {
  invalid: 'the recipient or subject is not acceptable (several lines, not one bare address)',
  unreachable: 'the SMTP server could not be reached in time, or TLS failed',
  rejected: 'the SMTP server refused the login, the sender, the recipient or the message',
  outbox: 'the outbox folder is not writable',
  closed: 'the mailer was closed',
} as const;

export type MailErrorCode = keyof typeof MAIL_ERROR_CODES;

/** Sending failed. The message names no address or link, so callers may log it as is. */
export class MailError extends Error {
  override name = 'MailError';
  constructor(
    readonly code: MailErrorCode,
    message: string = MAIL_ERROR_CODES[code],
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

export function isMailError(err: unknown): err is MailError {
  return err instanceof MailError;
}

/** `now`: the clock that dates outbox messages (the bridge passes its own). */
export function createMailer(config: MailConfig, log: Logger, now: () => number): Mailer {
  return config.smtp ? new SmtpMailer(config.from, config.smtp, log) : new OutboxMailer(config, log, now);
}

/**
 * A bare address and nothing else: no display name, no list. A comma or angle bracket here would add a
 * recipient or change who the message goes to.
 */
const BARE_ADDRESS = /^[^\s@<>()[\]\\,;:"]+@[^\s@<>()[\]\\,;:"]+$/;

function checkMail(mail: Mail): void {
  if (HEADER_BREAK.test(mail.to) || HEADER_BREAK.test(mail.subject)) {
    throw new MailError('invalid', 'recipient and subject must be single lines');
  }
  if (!BARE_ADDRESS.test(mail.to)) throw new MailError('invalid', 'the recipient is not one bare address');
}

/** The part of the address a log line may show: the recipient is personal data, the domain is not. */
function domainOf(address: string): string {
  return address.slice(address.lastIndexOf('@') + 1).toLowerCase();
}

type SmtpConfig = NonNullable<MailConfig['smtp']>;

/** nodemailer codes that mean the conversation never got to the point where the server could refuse. */
const UNREACHABLE_CODES = new Set(['ECONNECTION', 'ETIMEDOUT', 'ESOCKET', 'EDNS', 'ETLS', 'EPROXY']);

class SmtpMailer implements Mailer {
  readonly transport = 'smtp' as const;
  private readonly transporter: ReturnType<typeof nodemailer.createTransport>;
  private closed = false;

  constructor(
    private readonly from: string,
    smtp: SmtpConfig,
    private readonly log: Logger,
  ) {
    // One connection per message, no pool: confirmations are rare and a pooled idle connection only
    // ages out on the server side.
    this.transporter = nodemailer.createTransport({
      host: smtp.host,
      port: smtp.port,
      secure: smtp.secure,
      auth: smtp.user !== undefined ? { user: smtp.user, pass: smtp.pass } : undefined,
      tls: { rejectUnauthorized: smtp.rejectUnauthorized },
      connectionTimeout: smtp.timeoutMs,
      greetingTimeout: smtp.timeoutMs,
      // A server that stalls after the greeting must not hold a request for nodemailer's default 10 minutes.
      socketTimeout: smtp.timeoutMs,
      dnsTimeout: smtp.timeoutMs,
      // nodemailer's own logging would carry addresses and, with debug, the whole conversation.
      logger: false,
      debug: false,
      disableFileAccess: true,
      disableUrlAccess: true,
    });
  }

  async send(mail: Mail): Promise<void> {
    if (this.closed) throw new MailError('closed');
    checkMail(mail);
    const domain = domainOf(mail.to);
    try {
      await this.transporter.sendMail({ from: this.from, to: mail.to, subject: mail.subject, text: mail.text });
    } catch (err) {
      const e = err as { code?: unknown; responseCode?: unknown };
      const smtpCode = typeof e.code === 'string' ? e.code : undefined;
      const code: MailErrorCode =
        smtpCode !== undefined && UNREACHABLE_CODES.has(smtpCode) ? 'unreachable' : 'rejected';
      // The server's reply text can quote the recipient, so only the codes reach the log.
      this.log.warn({
        event: 'mail.failed',
        kind: mail.kind,
        domain,
        code,
        smtpCode,
        responseCode: typeof e.responseCode === 'number' ? e.responseCode : undefined,
      });
      throw new MailError(code, `${MAIL_ERROR_CODES[code]} (${smtpCode ?? 'unknown'})`, { cause: err });
    }
    this.log.info({ event: 'mail.sent', kind: mail.kind, domain });
  }

  close(): Promise<void> {
    this.closed = true;
    this.transporter.close();
    return Promise.resolve();
  }
}

class OutboxMailer implements Mailer {
  readonly transport = 'outbox' as const;
  private readonly dir: string;
  private readonly from: string;
  private readonly idDomain: string;
  /** Orders two messages written within the same millisecond. */
  private seq = 0;
  private closed = false;

  constructor(
    config: MailConfig,
    private readonly log: Logger,
    private readonly now: () => number,
  ) {
    this.dir = config.outboxDir;
    this.from = config.from;
    this.idDomain = /@([^\s<>@]+)>?\s*$/.exec(config.from)?.[1] ?? 'localhost';
  }

  send(mail: Mail): Promise<void> {
    // Synchronous file I/O below; the Promise keeps the Mailer contract and turns throws into rejections.
    return new Promise<void>((resolve) => {
      this.write(mail);
      resolve();
    });
  }

  private write(mail: Mail): void {
    if (this.closed) throw new MailError('closed');
    checkMail(mail);
    const now = new Date(this.now());
    const stamp = now.toISOString().replace(/[-:.]/g, '');
    this.seq = (this.seq + 1) % 1_000_000;
    const rand = randomBytes(4).toString('hex');
    // Fixed-width time first, then a counter: `ls` and a plain sort list the messages in the order sent.
    const file = join(this.dir, `${stamp}-${String(this.seq).padStart(6, '0')}-${mail.kind}-${rand}.eml`);
    const message = formatMessage({
      from: this.from,
      to: mail.to,
      subject: mail.subject,
      date: now,
      messageId: `<${stamp}.${rand}@${this.idDomain}>`,
      text: mail.text,
    });
    try {
      mkdirSync(this.dir, { recursive: true, mode: 0o700 });
      writeFileAtomic(file, message, 0o600);
    } catch (err) {
      this.log.warn({ event: 'mail.failed', kind: mail.kind, code: 'outbox', dir: this.dir });
      throw new MailError('outbox', undefined, { cause: err });
    }
    this.log.info({ event: 'mail.outbox', kind: mail.kind, file, link: mail.link });
  }

  close(): Promise<void> {
    this.closed = true;
    return Promise.resolve();
  }
}

interface Message {
  from: string;
  to: string;
  subject: string;
  date: Date;
  messageId: string;
  text: string;
}

/**
 * An RFC 5322 message with a UTF-8 plain-text body sent as 8bit, so that the link in the file stays readable
 * and clickable (quoted-printable would break it across lines and turn `=` into `=3D`).
 */
export function formatMessage(m: Message): string {
  const headers = [
    `From: ${m.from}`,
    `To: ${m.to}`,
    // Non-ASCII subjects become RFC 2047 encoded words; headers themselves must stay ASCII.
    `Subject: ${encodeWords(m.subject, 'Q', 52)}`,
    `Date: ${rfc5322Date(m.date)}`,
    `Message-ID: ${m.messageId}`,
    'MIME-Version: 1.0',
    'Content-Type: text/plain; charset=utf-8',
    'Content-Transfer-Encoding: 8bit',
  ];
  const body = m.text.replace(/\r\n|\r|\n/g, '\r\n');
  return `${headers.join('\r\n')}\r\n\r\n${body}${body.endsWith('\r\n') ? '' : '\r\n'}`;
}

/** `Thu, 01 Jan 2026 08:00:00 +0000`: the RFC 5322 form; `toUTCString()` ends in the obsolete `GMT`. */
function rfc5322Date(d: Date): string {
  return d.toUTCString().replace(/GMT$/, '+0000');
}
