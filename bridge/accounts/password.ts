/**
 * Password hashing with scrypt (docs/decisions.md §9).
 *
 * Hashes run on libuv's thread pool through node's asynchronous `crypto.scrypt`, so the event loop keeps
 * serving while one runs. At most `maxConcurrent` run at once, so that logins cannot take every core of a
 * small server, and at most `maxQueued` wait behind them in FIFO order; beyond that the caller gets
 * `HasherBusyError` at once and answers 429/503 instead of letting requests pile up.
 *
 * Stored form: `scrypt$<logN>$<r>$<p>$<salt>$<key>`, salt and key in unpadded standard base64. The parameters
 * travel with each hash, so raising the cost later keeps old hashes verifiable; `needsRehash` tells the login
 * route when to store a fresh one.
 */
import { randomBytes, scrypt, timingSafeEqual } from 'node:crypto';
import type { BridgeConfig } from '../config.js';

export interface ScryptParams {
  /** log2 of the CPU/memory cost N. */
  logN: number;
  /** Block size. */
  r: number;
  /** Parallelism. */
  p: number;
}

/** N=2^17, r=8, p=1: about 128 MiB and a few hundred milliseconds per hash. */
export const DEFAULT_SCRYPT: ScryptParams = Object.freeze({ logN: 17, r: 8, p: 1 });

export interface HasherOptions {
  params: ScryptParams;
  /** Hashes running at once on the thread pool. */
  maxConcurrent: number;
  /** Hashes waiting for a slot; one more is refused with `HasherBusyError`. */
  maxQueued: number;
}

/** The hashing queue is full: answer 429/503 rather than wait. */
export class HasherBusyError extends Error {
  override readonly name = 'HasherBusyError';
  constructor(message = 'password hasher busy') {
    super(message);
  }
}

const SALT_BYTES = 16;
const KEY_BYTES = 32;
const PREFIX = 'scrypt';

/** Bounds for parameters read back from storage, so that a corrupt row cannot ask for gigabytes. */
const MAX_LOGN = 20;
const MAX_R = 32;
const MAX_P = 16;
const MAX_MEMORY = 2 ** 30;

interface Decoded {
  params: ScryptParams;
  salt: Buffer;
  key: Buffer;
}

function validParams(p: ScryptParams): boolean {
  return (
    Number.isInteger(p.logN) &&
    Number.isInteger(p.r) &&
    Number.isInteger(p.p) &&
    p.logN >= 1 &&
    p.logN <= MAX_LOGN &&
    p.r >= 1 &&
    p.r <= MAX_R &&
    p.p >= 1 &&
    p.p <= MAX_P &&
    // scrypt itself requires N < 2^(16 r).
    p.logN < 16 * p.r &&
    128 * p.r * 2 ** p.logN <= MAX_MEMORY
  );
}

/**
 * OpenSSL needs 128 r (N + 2) bytes for V plus 128 r p for B; node refuses to start above `maxmem`
 * (default 32 MiB, too little for N=2^17, r=8). The margin covers OpenSSL's own rounding.
 */
function maxmemFor(p: ScryptParams): number {
  return 128 * p.r * (2 ** p.logN + 2) + 128 * p.r * p.p + 1024 * 1024;
}

function derive(password: Buffer, salt: Buffer, keylen: number, p: ScryptParams): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    scrypt(password, salt, keylen, { N: 2 ** p.logN, r: p.r, p: p.p, maxmem: maxmemFor(p) }, (err, key) => {
      if (err) reject(err);
      else resolve(key);
    });
  });
}

/** The same password typed on different systems may arrive composed or decomposed; NFC makes them equal. */
function passwordBytes(password: string): Buffer {
  return Buffer.from(password.normalize('NFC'), 'utf8');
}

function b64(buf: Buffer): string {
  return buf.toString('base64').replace(/=+$/, '');
}

/** Strict unpadded base64: anything that does not re-encode to itself is refused. */
function unb64(s: string): Buffer | undefined {
  if (!/^[A-Za-z0-9+/]+$/.test(s)) return undefined;
  const buf = Buffer.from(s, 'base64');
  return b64(buf) === s ? buf : undefined;
}

function decimal(s: string | undefined): number | undefined {
  return s !== undefined && /^[1-9][0-9]{0,2}$/.test(s) ? Number(s) : undefined;
}

function decode(encoded: unknown): Decoded | undefined {
  if (typeof encoded !== 'string' || encoded.length > 512) return undefined;
  const [prefix, logNText, rText, pText, saltText, keyText, ...rest] = encoded.split('$');
  if (prefix !== PREFIX || rest.length > 0 || saltText === undefined || keyText === undefined) return undefined;
  const logN = decimal(logNText);
  const r = decimal(rText);
  const p = decimal(pText);
  if (logN === undefined || r === undefined || p === undefined) return undefined;
  const params = { logN, r, p };
  if (!validParams(params)) return undefined;
  const saltBuf = unb64(saltText);
  const keyBuf = unb64(keyText);
  if (!saltBuf || !keyBuf) return undefined;
  if (saltBuf.length < 8 || saltBuf.length > 64 || keyBuf.length < 16 || keyBuf.length > 64) return undefined;
  return { params, salt: saltBuf, key: keyBuf };
}

export class PasswordHasher {
  private readonly params: ScryptParams;
  private readonly maxConcurrent: number;
  private readonly maxQueued: number;
  private readonly queue: (() => void)[] = [];
  private running = 0;
  private done = 0;
  /** What `verifyNothing` compares against: a hash of no password anyone knows. */
  private readonly decoy = { salt: randomBytes(SALT_BYTES), key: randomBytes(KEY_BYTES) };

  constructor(opts: HasherOptions) {
    if (!validParams(opts.params)) {
      throw new RangeError(`scrypt parameters out of range: ${JSON.stringify(opts.params)}`);
    }
    if (!Number.isInteger(opts.maxConcurrent) || opts.maxConcurrent < 1) {
      throw new RangeError(`maxConcurrent must be a positive integer, got ${opts.maxConcurrent}`);
    }
    if (!Number.isInteger(opts.maxQueued) || opts.maxQueued < 0) {
      throw new RangeError(`maxQueued must be a non-negative integer, got ${opts.maxQueued}`);
    }
    this.params = Object.freeze({ logN: opts.params.logN, r: opts.params.r, p: opts.params.p });
    this.maxConcurrent = opts.maxConcurrent;
    this.maxQueued = opts.maxQueued;
  }

  get stats(): { running: number; queued: number; done: number } {
    return { running: this.running, queued: this.queue.length, done: this.done };
  }

  async hash(password: string): Promise<string> {
    const salt = randomBytes(SALT_BYTES);
    const p = this.params;
    const key = await this.schedule(passwordBytes(password), salt, KEY_BYTES, p);
    return [PREFIX, p.logN, p.r, p.p, b64(salt), b64(key)].join('$');
  }

  /**
   * A malformed stored hash costs the same as a wrong password and answers false, so that an account whose
   * hash is damaged or deliberately unusable looks like any other from outside.
   */
  async verify(password: string, encoded: string): Promise<boolean> {
    const stored = decode(encoded);
    if (!stored) return this.verifyNothing(password);
    const key = await this.schedule(passwordBytes(password), stored.salt, stored.key.length, stored.params);
    return timingSafeEqual(key, stored.key);
  }

  /** For a login that does not exist: the work of a verify with the current parameters, then false. */
  async verifyNothing(password: string): Promise<false> {
    const key = await this.schedule(passwordBytes(password), this.decoy.salt, KEY_BYTES, this.params);
    timingSafeEqual(key, this.decoy.key);
    return false;
  }

  needsRehash(encoded: string): boolean {
    const stored = decode(encoded);
    if (!stored) return true;
    const s = stored.params;
    return (
      s.logN !== this.params.logN ||
      s.r !== this.params.r ||
      s.p !== this.params.p ||
      stored.salt.length !== SALT_BYTES ||
      stored.key.length !== KEY_BYTES
    );
  }

  /** Runs one derivation now if a slot is free, queues it otherwise, or refuses when the queue is full. */
  private schedule(password: Buffer, salt: Buffer, keylen: number, params: ScryptParams): Promise<Buffer> {
    if (this.running >= this.maxConcurrent && this.queue.length >= this.maxQueued) {
      return Promise.reject(new HasherBusyError());
    }
    return new Promise<Buffer>((resolve, reject) => {
      const start = (): void => {
        this.running++;
        derive(password, salt, keylen, params).then(
          (key) => {
            this.finish();
            resolve(key);
          },
          (err: unknown) => {
            this.finish();
            reject(err instanceof Error ? err : new Error(String(err)));
          },
        );
      };
      if (this.running < this.maxConcurrent) start();
      else this.queue.push(start);
    });
  }

  private finish(): void {
    this.running--;
    this.done++;
    const next = this.queue.shift();
    if (next) next();
  }
}

/** The password hasher the config asks for (`accounts`). */
export function hasherFor(config: BridgeConfig): PasswordHasher {
  const a = config.accounts;
  return new PasswordHasher({
    params: { logN: a.scryptLogN, r: a.scryptR, p: a.scryptP },
    maxConcurrent: a.hashConcurrency,
    maxQueued: a.hashQueue,
  });
}
