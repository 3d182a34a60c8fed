/**
 * Fetches a firmware image to a `.part` file (docs/decisions.md §7). The body is streamed to disk with backpressure,
 * never held in memory; a download that breaks off resumes from the bytes already on disk with an HTTP Range
 * request, so a gateway on a poor link makes progress across attempts and restarts. The file is fsynced before
 * the download counts as done, so a power cut after that cannot leave a short image behind a "downloaded" state.
 */
import { open, stat, truncate } from 'node:fs/promises';
import { type IncomingMessage, request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { setTimeout as delay } from 'node:timers/promises';
import { fsyncPath } from '../../lib/fsutil.js';

/**
 * `http`: the server answered with a status that is not the image (`status` says which); 401, 403 and 404 will
 * not change by asking again. `network`: the connection failed or ended early. `too-large`: the server sent more
 * than the announced size. `aborted`: the caller's signal fired.
 */
export type DownloadErrorKind = 'http' | 'network' | 'too-large' | 'aborted';

export class DownloadError extends Error {
  override name = 'DownloadError';
  constructor(
    readonly kind: DownloadErrorKind,
    message: string,
    readonly retryable: boolean,
    readonly status?: number,
  ) {
    super(message);
  }
}

export function isDownloadError(err: unknown): err is DownloadError {
  return err instanceof DownloadError;
}

export interface DownloadOptions {
  url: string;
  /** The job's download token, sent as `Authorization: Bearer <token>`. */
  token: string;
  /** The partial file; bytes already in it are kept and the rest is requested. */
  dest: string;
  /** The image size in bytes, from the job; the download stops there. */
  size: number;
  signal?: AbortSignal;
  /** Called as bytes arrive, with the bytes received so far (resumed bytes included) and the image size. */
  onProgress?: (bytes: number, total: number) => void;
}

export interface DownloadResult {
  bytes: number;
  /** The offset the last request started from: 0 for a fresh download, more when it resumed. */
  resumedFrom: number;
}

async function sizeOnDisk(path: string): Promise<number> {
  try {
    return (await stat(path)).size;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 0;
    throw err;
  }
}

function parseContentRange(value: string | null): { start: number; end: number; total?: number } | undefined {
  const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(value?.trim() ?? '');
  if (!m) return undefined;
  return { start: Number(m[1]), end: Number(m[2]), ...(m[3] === '*' ? {} : { total: Number(m[3]) }) };
}

function aborted(): DownloadError {
  return new DownloadError('aborted', 'the download was cancelled', false);
}

function tooLarge(size: number): DownloadError {
  return new DownloadError('too-large', `the server sent more than the announced ${size} bytes`, false);
}

/** Statuses where asking again later may succeed. */
function retryableStatus(status: number): boolean {
  return status >= 500 || status === 408 || status === 429;
}

function classify(err: unknown, signal: AbortSignal | undefined): DownloadError {
  if (signal?.aborted) return aborted();
  if (err instanceof DownloadError) return err;
  const e = err as Error & { cause?: unknown };
  const cause = e.cause instanceof Error ? `: ${e.cause.message}` : '';
  return new DownloadError('network', `${e.message ?? String(err)}${cause}`, true);
}

/** Bytes received but not yet written at which reading waits for the disk. */
const MAX_QUEUED_BYTES = 2 * 1024 * 1024;
/** The most bytes one write to the partial file takes from the queue. */
const WRITE_BYTES = 1024 * 1024;

/**
 * Each socket read arrives in a buffer of its own, outside the JavaScript heap, and V8 frees those only at a
 * collection, which a download alone (little heap garbage, much buffer garbage) triggers only after some 64 MB
 * have piled up. With the agent's `--expose-gc` flag, a minor collection every 2 MB frees the young ones, and a full
 * one every 32 MB (a few milliseconds, the agent's heap being small) those promoted while they waited in the
 * write queue, so that the agent's resident size stays flat during an update. Without the flag, nothing is done.
 */
let sinceMinor = 0;
let sinceMajor = 0;
const MINOR_EVERY_BYTES = 2 * 1024 * 1024;
const MAJOR_EVERY_BYTES = 32 * 1024 * 1024;
function collectChunks(bytes: number): void {
  if (typeof globalThis.gc !== 'function') return;
  sinceMinor += bytes;
  sinceMajor += bytes;
  if (sinceMajor >= MAJOR_EVERY_BYTES) {
    sinceMajor = 0;
    sinceMinor = 0;
    globalThis.gc();
  } else if (sinceMinor >= MINOR_EVERY_BYTES) {
    sinceMinor = 0;
    globalThis.gc({ type: 'minor' });
  }
}

interface Answer {
  status: number;
  statusText: string;
  header(name: string): string | null;
  body: IncomingMessage;
}

/**
 * One GET with node's own HTTP client: it streams the body as plain buffers, with less memory and less work per
 * byte than `fetch` (whose web streams the agent does not need for a file download).
 */
function get(url: string, headers: Record<string, string>, signal: AbortSignal | undefined): Promise<Answer> {
  return new Promise((resolve, reject) => {
    let u: URL;
    try {
      u = new URL(url);
    } catch {
      reject(new DownloadError('http', `not a URL: ${url}`, false));
      return;
    }
    if (u.protocol !== 'http:' && u.protocol !== 'https:') {
      reject(new DownloadError('http', `not an http or https URL: ${u.protocol}`, false));
      return;
    }
    const send = u.protocol === 'https:' ? httpsRequest : httpRequest;
    const req = send(u, { headers, ...(signal ? { signal } : {}) }, (res) => {
      resolve({
        status: res.statusCode ?? 0,
        statusText: res.statusMessage ?? '',
        header: (name) => {
          const v = res.headers[name];
          return v === undefined ? null : Array.isArray(v) ? v.join(', ') : v;
        },
        body: res,
      });
    });
    req.once('error', reject);
    req.end();
  });
}

/** One download attempt. Throws a DownloadError; the partial file stays for the next attempt. */
export async function download(opts: DownloadOptions): Promise<DownloadResult> {
  const { url, token, dest, size, signal, onProgress } = opts;
  if (signal?.aborted) throw aborted();

  let have = await sizeOnDisk(dest);
  if (have > size) {
    await truncate(dest, 0);
    have = 0;
  }
  if (have === size && size > 0) {
    await fsyncPath(dest);
    onProgress?.(size, size);
    return { bytes: size, resumedFrom: size };
  }

  // Byte offsets only mean something in the image itself, so no content encoding is accepted.
  const headers: Record<string, string> = { authorization: `Bearer ${token}`, 'accept-encoding': 'identity' };
  if (have > 0) headers.range = `bytes=${have}-`;

  let res: Answer;
  try {
    res = await get(url, headers, signal);
  } catch (err) {
    throw classify(err, signal);
  }

  let start: number;
  if (res.status === 206) {
    const range = parseContentRange(res.header('content-range'));
    if (!range || range.start !== have || (range.total !== undefined && range.total !== size)) {
      res.body.destroy();
      throw new DownloadError(
        'http',
        `the server answered a request from byte ${have} with Content-Range ${res.header('content-range')}`,
        true,
        206,
      );
    }
    start = have;
  } else if (res.status === 200) {
    // A server that ignores Range sends the whole image again: start over rather than append a second copy.
    start = 0;
  } else if (res.status === 416 && have > 0) {
    // The partial file does not fit the image on the server; the next attempt starts from zero.
    res.body.destroy();
    await truncate(dest, 0);
    throw new DownloadError('http', `the server refused to resume from byte ${have}`, true, 416);
  } else {
    res.body.destroy();
    throw new DownloadError(
      'http',
      `the server answered ${res.status} ${res.statusText}`.trim(),
      retryableStatus(res.status),
      res.status,
    );
  }

  const declared = res.header('content-length');
  if (declared !== null && start + Number(declared) > size) {
    res.body.destroy();
    throw tooLarge(size);
  }

  // Reading and writing overlap: chunks queue while the previous ones are written (all queued chunks in one
  // write), and reading waits only when the queue grows past a few megabytes. What arrived is written before an
  // error is passed on, so a broken connection keeps every byte it brought for the resume.
  let received = start;
  let written = start;
  const queue: Buffer[] = [];
  let queued = 0;
  let writer: Promise<void> | undefined;
  const file = await open(dest, start === 0 ? 'w' : 'a');
  const drain = async (): Promise<void> => {
    // A cancel stops the writing too: what is queued then is dropped, and the file ends where the cancel found it.
    while (queue.length > 0 && signal?.aborted !== true) {
      // At most about a megabyte per write, so that progress (and a cancel) is seen between writes.
      let take = 0;
      let bytes = 0;
      while (take < queue.length && bytes < WRITE_BYTES) bytes += queue[take++]!.length;
      const chunks = queue.splice(0, take);
      queued -= bytes;
      await file.writev(chunks);
      collectChunks(bytes);
      written += bytes;
      onProgress?.(written, size);
    }
  };
  const startWriter = (): Promise<void> => {
    writer ??= drain().finally(() => {
      writer = undefined;
    });
    return writer;
  };
  const settle = async (): Promise<void> => {
    while (writer !== undefined || (queue.length > 0 && signal?.aborted !== true)) await startWriter();
  };
  try {
    try {
      for await (const chunk of res.body as AsyncIterable<Buffer>) {
        if (received + chunk.length > size) throw tooLarge(size);
        queue.push(chunk);
        queued += chunk.length;
        received += chunk.length;
        const w = startWriter();
        if (queued >= MAX_QUEUED_BYTES) await w;
      }
    } catch (err) {
      await settle().catch(() => undefined);
      throw err;
    } finally {
      res.body.destroy();
    }
    await settle();
    if (signal?.aborted) throw aborted();
    if (received < size) {
      throw new DownloadError('network', `the connection ended after ${received} of ${size} bytes`, true);
    }
    await file.sync();
  } catch (err) {
    throw classify(err, signal);
  } finally {
    await settle().catch(() => undefined);
    await file.close();
  }
  return { bytes: received, resumedFrom: start };
}

export interface RetryPolicy {
  /** Attempts in all, the first included. */
  attempts: number;
  /** Wait before the second attempt, in milliseconds; doubled after each failure up to `maxDelayMs`. */
  baseDelayMs: number;
  maxDelayMs: number;
}

export const DEFAULT_RETRY: RetryPolicy = { attempts: 6, baseDelayMs: 2_000, maxDelayMs: 60_000 };

/**
 * Downloads with retries on retryable failures, each attempt resuming from the partial file. Throws the last
 * error when the attempts run out or the error will not change by asking again.
 */
export async function downloadWithRetry(
  opts: DownloadOptions,
  policy: RetryPolicy = DEFAULT_RETRY,
  onRetry?: (err: DownloadError, attempt: number, waitMs: number) => void,
): Promise<DownloadResult> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await download(opts);
    } catch (err) {
      const e = classify(err, opts.signal);
      if (!e.retryable || attempt >= policy.attempts) throw e;
      const waitMs = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** (attempt - 1));
      onRetry?.(e, attempt, waitMs);
      try {
        await delay(waitMs, undefined, opts.signal ? { signal: opts.signal } : {});
      } catch {
        throw aborted();
      }
    }
  }
}
