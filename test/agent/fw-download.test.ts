/**
 * Firmware download (docs/decisions.md §7) against a real HTTP server on port 0 that checks the job token, honours
 * Range, and can misbehave on demand: cut the connection, ignore Range, send too much. The server counts the
 * bytes it sends, so a resume is shown to transfer only what was missing.
 */
import { createHash, generateKeyPairSync, randomBytes } from 'node:crypto';
import { existsSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { type IncomingMessage, type Server, type ServerResponse, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DownloadError, download, downloadWithRetry } from '../../agent/fw/download.js';
import { verifyImage } from '../../agent/fw/verify.js';
import { signFirmware } from '../../protocol/index.js';
import { tempDir } from '../support/agent.js';

const TOKEN = 'job-token-0123456789abcdef';
const CHUNK = 64 * 1024;

/** Something the server can serve from any offset without holding it whole. */
interface Source {
  size: number;
  chunks(start: number): Iterable<Buffer>;
}

function bufferSource(buf: Buffer): Source {
  return {
    size: buf.length,
    *chunks(start) {
      for (let at = start; at < buf.length; at += CHUNK) yield buf.subarray(at, Math.min(at + CHUNK, buf.length));
    },
  };
}

/** `blocks` copies of one random block: large, yet cheap to serve and to hash on the side. */
function repeatedSource(block: Buffer, blocks: number): Source & { sha256: string } {
  const hash = createHash('sha256');
  for (let i = 0; i < blocks; i++) hash.update(block);
  const size = block.length * blocks;
  return {
    size,
    sha256: hash.digest('hex'),
    *chunks(start) {
      let at = start;
      while (at < size) {
        const inBlock = at % block.length;
        const piece = block.subarray(inBlock);
        yield piece;
        at += piece.length;
      }
    },
  };
}

interface Served {
  range: string | undefined;
  status: number;
  sent: number;
}

interface Behaviour {
  /** Destroy the socket after this many body bytes, on the next request only. */
  cutAfter?: number;
  /** Answer 200 with the whole image even to a Range request. */
  ignoreRange?: boolean;
  /** Send this many bytes past the end, chunked (no Content-Length). */
  overshoot?: number;
}

class ImageServer {
  readonly requests: Served[] = [];
  behaviour: Behaviour = {};
  private server: Server;
  url = '';

  constructor(private readonly source: Source) {
    this.server = createServer((req, res) => this.handle(req, res));
  }

  async start(): Promise<this> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/fw/image.bin`;
    return this;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const served: Served = { range: req.headers.range, status: 0, sent: 0 };
    this.requests.push(served);
    const reply = (status: number, headers: Record<string, string | number> = {}) => {
      served.status = status;
      res.writeHead(status, headers);
    };
    if (req.headers.authorization !== `Bearer ${TOKEN}`) {
      reply(401);
      res.end();
      return;
    }
    const { size } = this.source;
    const { cutAfter, ignoreRange, overshoot } = this.behaviour;
    this.behaviour = { ...this.behaviour, cutAfter: undefined };
    let start = 0;
    const m = /^bytes=(\d+)-$/.exec(req.headers.range ?? '');
    if (m && !ignoreRange) {
      start = Number(m[1]);
      if (start >= size) {
        reply(416, { 'content-range': `bytes */${size}` });
        res.end();
        return;
      }
      reply(206, { 'content-range': `bytes ${start}-${size - 1}/${size}`, 'content-length': size - start });
    } else {
      reply(200, overshoot ? {} : { 'content-length': size });
    }
    void this.pump(res, served, start, cutAfter, overshoot ?? 0);
  }

  private async pump(
    res: ServerResponse,
    served: Served,
    start: number,
    cutAfter: number | undefined,
    overshoot: number,
  ): Promise<void> {
    const chunks = [...[this.source.chunks(start)], overshoot > 0 ? [randomBytes(overshoot)] : []];
    for (const list of chunks) {
      for (let chunk of list) {
        if (res.destroyed) return;
        if (cutAfter !== undefined && served.sent + chunk.length >= cutAfter) {
          chunk = chunk.subarray(0, cutAfter - served.sent);
          served.sent += chunk.length;
          await new Promise<void>((resolve) => res.write(chunk, () => resolve()));
          res.socket?.destroy();
          return;
        }
        served.sent += chunk.length;
        if (!res.write(chunk)) await drained(res);
      }
    }
    res.end();
  }
}

function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

async function downloadError(p: Promise<unknown>): Promise<DownloadError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(DownloadError);
    return err as DownloadError;
  }
  throw new Error('expected a DownloadError');
}

const dir = tempDir('devcloud-fw-download-');
let n = 0;
const partPath = () => join(dir, `image-${++n}.part`);

const image = randomBytes(3 * 1024 * 1024 + 12_345);
let server: ImageServer;

beforeAll(async () => {
  server = await new ImageServer(bufferSource(image)).start();
});
afterAll(async () => {
  await server.stop();
  rmSync(dir, { recursive: true, force: true });
});

function fresh(behaviour: Behaviour = {}): void {
  server.requests.length = 0;
  server.behaviour = behaviour;
}

describe('download', () => {
  it('fetches the whole image with the job token', async () => {
    fresh();
    const dest = partPath();
    const progress: Array<[number, number]> = [];
    const r = await download({
      url: server.url,
      token: TOKEN,
      dest,
      size: image.length,
      onProgress: (bytes, total) => progress.push([bytes, total]),
    });
    expect(r).toEqual({ bytes: image.length, resumedFrom: 0 });
    expect(readFileSync(dest).equals(image)).toBe(true);
    expect(server.requests).toEqual([{ range: undefined, status: 200, sent: image.length }]);
    // Progress only grows, always against the image size, and ends at the size.
    expect(progress.length).toBeGreaterThan(1);
    for (let i = 1; i < progress.length; i++) expect(progress[i]![0]).toBeGreaterThanOrEqual(progress[i - 1]![0]);
    expect(progress.every(([, total]) => total === image.length)).toBe(true);
    expect(progress.at(-1)).toEqual([image.length, image.length]);
  });

  it('resumes a cut download with a Range request and fetches only the rest', async () => {
    const cut = 1_500_000;
    fresh({ cutAfter: cut });
    const dest = partPath();
    const first = await downloadError(download({ url: server.url, token: TOKEN, dest, size: image.length }));
    expect(first.kind).toBe('network');
    expect(first.retryable).toBe(true);
    const have = statSync(dest).size;
    expect(have).toBeGreaterThan(0);
    expect(have).toBeLessThanOrEqual(cut);
    expect(readFileSync(dest).equals(image.subarray(0, have))).toBe(true);

    const progress: number[] = [];
    const r = await download({
      url: server.url,
      token: TOKEN,
      dest,
      size: image.length,
      onProgress: (bytes) => progress.push(bytes),
    });
    expect(r).toEqual({ bytes: image.length, resumedFrom: have });
    expect(readFileSync(dest).equals(image)).toBe(true);
    expect(server.requests).toHaveLength(2);
    expect(server.requests[0]).toMatchObject({ range: undefined, status: 200, sent: cut });
    expect(server.requests[1]).toEqual({ range: `bytes=${have}-`, status: 206, sent: image.length - have });
    // Progress on a resumed download counts the bytes already on disk.
    expect(progress[0]).toBeGreaterThan(have);
  });

  it('retries on its own after a cut, resuming from the partial file', async () => {
    fresh({ cutAfter: 700_000 });
    const dest = partPath();
    const retries: string[] = [];
    const r = await downloadWithRetry(
      { url: server.url, token: TOKEN, dest, size: image.length },
      { attempts: 3, baseDelayMs: 0, maxDelayMs: 0 },
      (err) => retries.push(err.kind),
    );
    expect(retries).toEqual(['network']);
    expect(readFileSync(dest).equals(image)).toBe(true);
    expect(r.resumedFrom).toBeGreaterThan(0);
    expect(server.requests.map((s) => s.status)).toEqual([200, 206]);
    expect(server.requests[0]!.sent + server.requests[1]!.sent).toBeLessThanOrEqual(image.length + 700_000);
  });

  it('starts over when the server ignores Range and sends the whole image', async () => {
    fresh({ ignoreRange: true });
    const dest = partPath();
    // A partial file with wrong bytes: appending to it would corrupt the image.
    writeFileSync(dest, Buffer.alloc(1_000_000, 0xaa));
    const r = await download({ url: server.url, token: TOKEN, dest, size: image.length });
    expect(r).toEqual({ bytes: image.length, resumedFrom: 0 });
    expect(readFileSync(dest).equals(image)).toBe(true);
    expect(server.requests).toEqual([{ range: 'bytes=1000000-', status: 200, sent: image.length }]);
  });

  it('does not ask again for a complete file', async () => {
    fresh();
    const dest = partPath();
    writeFileSync(dest, image);
    expect(await download({ url: server.url, token: TOKEN, dest, size: image.length })).toEqual({
      bytes: image.length,
      resumedFrom: image.length,
    });
    expect(server.requests).toEqual([]);
  });

  it('discards a partial file longer than the image and starts over', async () => {
    fresh();
    const dest = partPath();
    writeFileSync(dest, Buffer.alloc(image.length + 10));
    await download({ url: server.url, token: TOKEN, dest, size: image.length });
    expect(readFileSync(dest).equals(image)).toBe(true);
    expect(server.requests).toEqual([{ range: undefined, status: 200, sent: image.length }]);
  });

  it('reports a wrong token as an http 401 that is not worth retrying', async () => {
    fresh();
    const dest = partPath();
    const err = await downloadError(
      downloadWithRetry(
        { url: server.url, token: 'wrong', dest, size: image.length },
        { attempts: 5, baseDelayMs: 0, maxDelayMs: 0 },
      ),
    );
    expect(err).toMatchObject({ kind: 'http', status: 401, retryable: false });
    expect(server.requests).toHaveLength(1);
    expect(existsSync(dest)).toBe(false);
  });

  it('reports a 404 as not retryable and a 503 as retryable', async () => {
    const answer = async (status: number) => {
      const s = createServer((_req, res) => res.writeHead(status).end('no'));
      await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
      try {
        const url = `http://127.0.0.1:${(s.address() as AddressInfo).port}/x`;
        return await downloadError(download({ url, token: TOKEN, dest: partPath(), size: 10 }));
      } finally {
        s.closeAllConnections();
        await new Promise<void>((resolve) => s.close(() => resolve()));
      }
    };
    expect(await answer(404)).toMatchObject({ kind: 'http', status: 404, retryable: false });
    expect(await answer(403)).toMatchObject({ kind: 'http', status: 403, retryable: false });
    expect(await answer(503)).toMatchObject({ kind: 'http', status: 503, retryable: true });
  });

  it('stops a server that sends more than the announced size', async () => {
    fresh({ overshoot: 100_000 });
    const dest = partPath();
    const err = await downloadError(download({ url: server.url, token: TOKEN, dest, size: image.length }));
    expect(err).toMatchObject({ kind: 'too-large', retryable: false });
    expect(statSync(dest).size).toBeLessThanOrEqual(image.length);
  });

  it('refuses a Content-Length larger than the announced size before reading the body', async () => {
    fresh();
    const dest = partPath();
    const err = await downloadError(download({ url: server.url, token: TOKEN, dest, size: image.length - 1 }));
    expect(err.kind).toBe('too-large');
    expect(existsSync(dest)).toBe(false);
  });

  it('refuses a 206 whose Content-Range does not start where the partial file ends', async () => {
    const s = createServer((_req, res) => {
      res.writeHead(206, { 'content-range': `bytes 0-9/${image.length}`, 'content-length': 10 });
      res.end(image.subarray(0, 10));
    });
    await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
    try {
      const dest = partPath();
      writeFileSync(dest, image.subarray(0, 100));
      const url = `http://127.0.0.1:${(s.address() as AddressInfo).port}/x`;
      const err = await downloadError(download({ url, token: TOKEN, dest, size: image.length }));
      expect(err).toMatchObject({ kind: 'http', status: 206, retryable: true });
      expect(readFileSync(dest).equals(image.subarray(0, 100))).toBe(true);
    } finally {
      s.closeAllConnections();
      await new Promise<void>((resolve) => s.close(() => resolve()));
    }
  });

  it('reports a refused connection as a retryable network error', async () => {
    const s = createServer();
    await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
    const port = (s.address() as AddressInfo).port;
    await new Promise<void>((resolve) => s.close(() => resolve()));
    const err = await downloadError(
      download({ url: `http://127.0.0.1:${port}/x`, token: TOKEN, dest: partPath(), size: 10 }),
    );
    expect(err).toMatchObject({ kind: 'network', retryable: true });
  });

  it('stops on abort and keeps the partial file for a later resume', async () => {
    fresh();
    const dest = partPath();
    const ac = new AbortController();
    const err = await downloadError(
      download({
        url: server.url,
        token: TOKEN,
        dest,
        size: image.length,
        signal: ac.signal,
        onProgress: (bytes) => {
          if (bytes >= 1_000_000) ac.abort();
        },
      }),
    );
    expect(err).toMatchObject({ kind: 'aborted', retryable: false });
    const have = statSync(dest).size;
    expect(have).toBeGreaterThan(0);
    expect(have).toBeLessThan(image.length);
    expect(readFileSync(dest).equals(image.subarray(0, have))).toBe(true);

    // An aborted signal stops before any request.
    const before = server.requests.length;
    expect(
      await downloadError(download({ url: server.url, token: TOKEN, dest, size: image.length, signal: ac.signal })),
    ).toMatchObject({ kind: 'aborted' });
    expect(server.requests).toHaveLength(before);

    await download({ url: server.url, token: TOKEN, dest, size: image.length });
    expect(readFileSync(dest).equals(image)).toBe(true);
    expect(server.requests.at(-1)).toMatchObject({ range: `bytes=${have}-`, status: 206, sent: image.length - have });
  });
});

describe('a large image', () => {
  it('downloads and verifies 64 MB without holding it in memory', async () => {
    const big = repeatedSource(randomBytes(CHUNK), 1024);
    const bigServer = await new ImageServer(big).start();
    try {
      const { privateKey, publicKey } = generateKeyPairSync('ed25519');
      const meta = { name: 'big-os', platform: 'rpi4', version: 1, size: big.size, sha256: big.sha256 };
      const signature = signFirmware(meta, privateKey.export({ format: 'pem', type: 'pkcs8' }));
      const keys = [publicKey.export({ format: 'pem', type: 'spki' }).toString()];

      // Warm up the HTTP client and the file paths first, so that their one-off allocations are not counted.
      const warm = partPath();
      await download({ url: server.url, token: TOKEN, dest: warm, size: image.length });
      await verifyImage(warm, { ...meta, size: image.length }, signature, keys);

      const startRss = process.memoryUsage.rss();
      let peakRss = startRss;
      const sample = () => {
        peakRss = Math.max(peakRss, process.memoryUsage.rss());
      };
      const dest = partPath();
      await download({ url: bigServer.url, token: TOKEN, dest, size: big.size, onProgress: sample });
      sample();
      expect(statSync(dest).size).toBe(64 * 1024 * 1024);
      expect(await verifyImage(dest, meta, signature, keys)).toEqual({ ok: true, keyIndex: 0 });
      sample();
      expect(bigServer.requests).toEqual([{ range: undefined, status: 200, sent: big.size }]);
      expect(peakRss - startRss).toBeLessThan(40 * 1024 * 1024);
    } finally {
      await bigServer.stop();
    }
  });
});
