/**
 * A client on another host, made on this machine: a network namespace of the test's own, joined to the root
 * namespace by a veth pair on a /30 of 169.254.0.0/16 chosen per run. A server listening on the host side's
 * address (or on a wildcard one) sees the namespace's requests come from the peer address, which is not a
 * loopback one. Needs `ip` (iproute2) and root (CAP_NET_ADMIN); no traffic leaves the machine.
 */
import { execFile } from 'node:child_process';
import { randomBytes, randomInt } from 'node:crypto';
import { promisify } from 'node:util';
import { lacking, which } from './system.js';

const run = promisify(execFile);

export interface Netns {
  /** The namespace's name (`ip netns exec <name> ...`). */
  name: string;
  /** The address of the veth end in the root namespace, which the namespace reaches. */
  hostAddress: string;
  /** The address of the veth end inside the namespace: the client's address as a server here sees it. */
  clientAddress: string;
  /** A GET from inside the namespace, with node's client in a child process. */
  get(url: string, headers?: Record<string, string>): Promise<{ status: number; body: string }>;
  /** Removes the namespace and the veth pair; safe to call twice, and after a failed setup. */
  close(): Promise<void>;
}

/** Why a namespace cannot be made here (what is missing), or undefined when it can be tried. */
export function netnsUnavailable(): string | undefined {
  const lack = lacking('ip', 'root');
  return lack === undefined ? undefined : `${lack} (CAP_NET_ADMIN) to make a network namespace`;
}

/** `ip`, found where Debian puts it even when PATH lacks the sbin folders. */
const IP = () => which('ip') ?? 'ip';

/** A /30 of 169.254.0.0/16 on which this machine has no address yet: [host side, namespace side]. */
async function freeLinkLocalPair(): Promise<[string, string]> {
  const { stdout } = await run(IP(), ['-4', '-o', 'addr', 'show']);
  const taken = new Set([...stdout.matchAll(/inet (169\.254\.\d+\.\d+)/g)].map((m) => m[1]!));
  for (let i = 0; i < 100; i++) {
    // Not 169.254.169.0/24, where clouds put their metadata service, nor the reserved first and last /24.
    const third = randomInt(1, 254);
    if (third === 169) continue;
    const base = 4 * randomInt(0, 64);
    const block = [0, 1, 2, 3].map((k) => `169.254.${third}.${base + k}`);
    if (block.some((a) => taken.has(a))) continue;
    return [block[1]!, block[2]!];
  }
  throw new Error('no free /30 in 169.254.0.0/16');
}

/** The client run inside the namespace: GET argv[1] with the headers of DC_HEADERS, prints status and body. */
const CLIENT = `
const http = require('node:http');
const r = http.get(process.argv[1], { headers: JSON.parse(process.env.DC_HEADERS) }, (res) => {
  const chunks = [];
  res.on('data', (c) => chunks.push(c));
  res.on('end', () =>
    process.stdout.write(JSON.stringify({ status: res.statusCode, body: Buffer.concat(chunks).toString('utf8') })),
  );
});
r.setTimeout(10000, () => r.destroy(new Error('timed out')));
r.on('error', (e) => { console.error(e.message); process.exit(1); });
`;

/**
 * Makes the namespace `dc<pid><random>` and the veth pair, both up. On failure it removes what it made and
 * throws, saying which `ip` command failed.
 */
export async function makeNetns(): Promise<Netns> {
  const tag = randomBytes(3).toString('hex');
  const name = `dc${process.pid}${tag}`;
  // Interface names have at most 15 characters.
  const hostIf = `dch${tag}`;
  const peerIf = `dcp${tag}`;
  let closed = false;
  const close = async () => {
    if (closed) return;
    closed = true;
    // Removing the namespace removes the peer, and with it the pair; the host side goes too should the pair
    // not have been moved yet.
    await run(IP(), ['link', 'del', hostIf]).catch(() => undefined);
    await run(IP(), ['netns', 'del', name]).catch(() => undefined);
  };
  const ip = async (...args: string[]) => {
    try {
      await run(IP(), args);
    } catch (e) {
      throw new Error(`ip ${args.join(' ')}: ${(e as { stderr?: string }).stderr?.trim() || String(e)}`);
    }
  };
  try {
    const [hostAddress, clientAddress] = await freeLinkLocalPair();
    await ip('netns', 'add', name);
    await ip('link', 'add', hostIf, 'type', 'veth', 'peer', 'name', peerIf);
    await ip('link', 'set', peerIf, 'netns', name);
    await ip('addr', 'add', `${hostAddress}/30`, 'dev', hostIf);
    await ip('link', 'set', hostIf, 'up');
    await ip('netns', 'exec', name, IP(), 'addr', 'add', `${clientAddress}/30`, 'dev', peerIf);
    await ip('netns', 'exec', name, IP(), 'link', 'set', peerIf, 'up');
    await ip('netns', 'exec', name, IP(), 'link', 'set', 'lo', 'up');
    return {
      name,
      hostAddress,
      clientAddress,
      async get(url, headers = {}) {
        // Asynchronous: the server answering may be in this very process.
        const { stdout } = await run(IP(), ['netns', 'exec', name, process.execPath, '-e', CLIENT, url], {
          env: { ...process.env, DC_HEADERS: JSON.stringify(headers) },
          timeout: 20_000,
        });
        return JSON.parse(stdout) as { status: number; body: string };
      },
      close,
    };
  } catch (e) {
    await close();
    throw e;
  }
}
