/**
 * Fetches a firmware image to a `.part` file (DESIGN section 7). The body is streamed to disk with backpressure,
 * never held in memory; a download that breaks off resumes from the bytes already on disk with an HTTP Range
 * request, so a gateway on a poor link makes progress across attempts and restarts. The file is fsynced before
 * the download counts as done, so a power cut after that cannot leave a short image behind a "downloaded" state.
 */
import { createWriteStream } from 'node:fs';
import { open, stat, truncate } from 'node:fs/promises';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as NodeReadableStream } from 'node:stream/web';
import { setTimeout as delay } from 'node:timers/promises';

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
  fetchImpl?: typeof fetch;
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

async function syncFile(path: string): Promise<void> {
  const handle = await open(path, 'r+');
  try {
    await handle.sync();
  } finally {
    await handle.close();
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

async function discard(res: Response): Promise<void> {
  try {
    await res.body?.cancel();
  } catch {
    // The body is unwanted; a failure to drop it changes nothing.
  }
}

/** One download attempt. Throws a DownloadError; the partial file stays for the next attempt. */
export async function download(opts: DownloadOptions): Promise<DownloadResult> {
  const { url, token, dest, size, signal, onProgress } = opts;
  const fetchImpl = opts.fetchImpl ?? fetch;
  if (signal?.aborted) throw aborted();

  let have = await sizeOnDisk(dest);
  if (have > size) {
    await truncate(dest, 0);
    have = 0;
  }
  if (have === size && size > 0) {
    await syncFile(dest);
    onProgress?.(size, size);
    return { bytes: size, resumedFrom: size };
  }

  // Byte offsets only mean something in the image itself, so no content encoding is accepted.
  const headers: Record<string, string> = { authorization: `Bearer ${token}`, 'accept-encoding': 'identity' };
  if (have > 0) headers.range = `bytes=${have}-`;

  let res: Response;
  try {
    res = await fetchImpl(url, { headers, ...(signal ? { signal } : {}) });
  } catch (err) {
    throw classify(err, signal);
  }

  let start: number;
  if (res.status === 206) {
    const range = parseContentRange(res.headers.get('content-range'));
    if (!range || range.start !== have || (range.total !== undefined && range.total !== size)) {
      await discard(res);
      throw new DownloadError(
        'http',
        `the server answered a request from byte ${have} with Content-Range ${res.headers.get('content-range')}`,
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
    await discard(res);
    await truncate(dest, 0);
    throw new DownloadError('http', `the server refused to resume from byte ${have}`, true, 416);
  } else {
    await discard(res);
    throw new DownloadError(
      'http',
      `the server answered ${res.status} ${res.statusText}`.trim(),
      retryableStatus(res.status),
      res.status,
    );
  }

  const declared = res.headers.get('content-length');
  if (declared !== null && start + Number(declared) > size) {
    await discard(res);
    throw tooLarge(size);
  }
  if (!res.body) throw new DownloadError('http', `the server answered ${res.status} without a body`, true, res.status);

  let received = start;
  const limit = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      if (received + chunk.length > size) {
        done(tooLarge(size));
        return;
      }
      received += chunk.length;
      onProgress?.(received, size);
      done(null, chunk);
    },
  });

  try {
    await pipeline(
      Readable.fromWeb(res.body as NodeReadableStream<Uint8Array>),
      limit,
      createWriteStream(dest, { flags: start === 0 ? 'w' : 'a' }),
      { signal },
    );
    if (received < size) {
      throw new DownloadError('network', `the connection ended after ${received} of ${size} bytes`, true);
    }
    // fsync reaches the file's data whichever descriptor wrote it.
    await syncFile(dest);
  } catch (err) {
    throw classify(err, signal);
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
