/**
 * A real SMTP server for tests (the `smtp-server` package) on a port the OS picks. It keeps every message it
 * accepts, with the envelope and the decoded subject and text body, so that a test can read the link a mail
 * carries. Plain SMTP without STARTTLS by default, so the bridge needs no TLS settings to reach it.
 */
import { SMTPServer, type SMTPServerOptions } from 'smtp-server';

export interface SmtpMessage {
  /** Envelope sender (MAIL FROM). */
  from: string;
  /** Envelope recipients (RCPT TO). */
  to: string[];
  /** The message as received, CRLF line ends. */
  raw: string;
  /** Header values by lower-case name, unfolded; the first of repeated headers. */
  headers: Map<string, string>;
  /** The Subject header, encoded words decoded. */
  subject: string;
  /** The body, its transfer encoding (quoted-printable, base64) undone, as UTF-8. */
  text: string;
  /** Every http(s) URL in the body, in order. */
  links: string[];
  /** Whether the session was upgraded with STARTTLS. */
  secure: boolean;
  /** The user that authenticated, if any. */
  user?: string;
}

export interface SmtpServerOptions {
  /** Require this login before MAIL FROM; without it the server offers no AUTH at all. */
  auth?: { user: string; pass: string };
  /** Offer STARTTLS with smtp-server's built-in self-signed certificate. */
  starttls?: boolean;
}

export interface TestSmtpServer {
  port: number;
  messages: SmtpMessage[];
  /** Resolves with the first message, already received or still to come, that matches. */
  waitFor(match?: (m: SmtpMessage) => boolean, timeoutMs?: number): Promise<SmtpMessage>;
  close(): Promise<void>;
}

export async function startSmtpServer(opts: SmtpServerOptions = {}): Promise<TestSmtpServer> {
  const messages: SmtpMessage[] = [];
  const waiters = new Set<(m: SmtpMessage) => void>();
  const auth = opts.auth;
  const disabled = [...(auth ? [] : ['AUTH']), ...(opts.starttls ? [] : ['STARTTLS'])];
  const options: SMTPServerOptions = {
    name: 'smtp.test',
    logger: false,
    disableReverseLookup: true,
    disabledCommands: disabled,
    allowInsecureAuth: true,
    authOptional: !auth,
    closeTimeout: 1000,
    onAuth(login, _session, callback) {
      if (auth && login.username === auth.user && login.password === auth.pass) {
        callback(null, { user: login.username });
      } else {
        callback(new Error('Invalid username or password'));
      }
    },
    onData(stream, session, callback) {
      const chunks: Buffer[] = [];
      stream.on('data', (c: Buffer) => chunks.push(c));
      stream.on('error', (err) => callback(err));
      stream.on('end', () => {
        const envelope = session.envelope;
        const message = parseMessage(Buffer.concat(chunks).toString('utf8'), {
          from: envelope.mailFrom ? envelope.mailFrom.address : '',
          to: envelope.rcptTo.map((r) => r.address),
          secure: session.secure,
          user: typeof session.user === 'string' ? session.user : undefined,
        });
        messages.push(message);
        for (const w of [...waiters]) w(message);
        callback();
      });
    },
  };
  const server = new SMTPServer(options);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  // Errors after start are a client misbehaving (the tests make some do so on purpose); they must not crash.
  server.on('error', () => undefined);
  const port = (server.server.address() as { port: number }).port;

  return {
    port,
    messages,
    waitFor(match = () => true, timeoutMs = 10_000) {
      const found = messages.find(match);
      if (found) return Promise.resolve(found);
      return new Promise<SmtpMessage>((resolve, reject) => {
        const waiter = (m: SmtpMessage) => {
          if (!match(m)) return;
          clearTimeout(timer);
          waiters.delete(waiter);
          resolve(m);
        };
        const timer = setTimeout(() => {
          waiters.delete(waiter);
          reject(new Error(`no matching message within ${timeoutMs} ms (${messages.length} received)`));
        }, timeoutMs);
        waiters.add(waiter);
      });
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/** Splits and decodes a single-part message, which is what the bridge sends. */
export function parseMessage(
  raw: string,
  envelope: { from: string; to: string[]; secure: boolean; user?: string | undefined },
): SmtpMessage {
  const split = raw.indexOf('\r\n\r\n');
  const head = split < 0 ? raw : raw.slice(0, split);
  const body = split < 0 ? '' : raw.slice(split + 4);
  const headers = new Map<string, string>();
  // Unfold continuation lines (RFC 5322 2.2.3) before splitting into fields.
  for (const line of head.replace(/\r\n(?=[ \t])/g, '').split('\r\n')) {
    const colon = line.indexOf(':');
    if (colon <= 0) continue;
    const name = line.slice(0, colon).trim().toLowerCase();
    if (!headers.has(name)) headers.set(name, line.slice(colon + 1).trim());
  }
  const cte = (headers.get('content-transfer-encoding') ?? '7bit').toLowerCase();
  const text = decodeBody(body, cte);
  const message: SmtpMessage = {
    from: envelope.from,
    to: envelope.to,
    raw,
    headers,
    subject: decodeWords(headers.get('subject') ?? ''),
    text,
    links: text.match(/https?:\/\/[^\s<>"]+/g) ?? [],
    secure: envelope.secure,
  };
  if (envelope.user !== undefined) message.user = envelope.user;
  return message;
}

function decodeBody(body: string, cte: string): string {
  if (cte === 'base64') return Buffer.from(body.replace(/\s+/g, ''), 'base64').toString('utf8');
  if (cte === 'quoted-printable') return decodeQuotedPrintable(body);
  return body;
}

function decodeQuotedPrintable(s: string): string {
  const bytes: number[] = [];
  // Soft line breaks (`=` at the end of a line) join lines; `=XX` is one byte.
  const joined = s.replace(/=\r?\n/g, '');
  for (let i = 0; i < joined.length; i++) {
    const ch = joined[i] as string;
    const hex = joined.slice(i + 1, i + 3);
    if (ch === '=' && /^[0-9A-Fa-f]{2}$/.test(hex)) {
      bytes.push(parseInt(hex, 16));
      i += 2;
    } else {
      bytes.push(...Buffer.from(ch, 'utf8'));
    }
  }
  return Buffer.from(bytes).toString('utf8');
}

/** RFC 2047 encoded words (`=?UTF-8?Q?...?=`, `=?UTF-8?B?...?=`); the space between two of them is dropped. */
function decodeWords(value: string): string {
  return value
    .replace(/(\?=)\s+(=\?)/g, '$1$2')
    .replace(/=\?([^?]+)\?([QqBb])\?([^?]*)\?=/g, (_all, _charset: string, enc: string, data: string) =>
      enc.toUpperCase() === 'B'
        ? Buffer.from(data, 'base64').toString('utf8')
        : decodeQuotedPrintable(data.replace(/_/g, ' ')),
    );
}
