/**
 * A V8 CPU profile (node's `--cpu-prof`, a `.cpuprofile` JSON file) summed by where its time went: the samples
 * whose stack holds a frame of a given source file, callees included (the store's reads and writes that code makes),
 * and the functions those samples were in (self time). A profile samples the main thread only: time on other
 * threads (the garbage collector's helpers, libuv's pool) is in none of its figures.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

export interface CpuProfile {
  nodes: Array<{
    id: number;
    callFrame: { functionName: string; url: string; lineNumber: number };
    children?: number[];
  }>;
  samples: number[];
  /** µs before each sample. */
  timeDeltas: number[];
}

export interface ProfileShare {
  /** Sampled time, and of it the time the thread was idle, ms. */
  totalMs: number;
  idleMs: number;
  /** Samples with a frame of a matching file on their stack, ms. */
  matchedMs: number;
  /** Of those, where the time was spent (the sampled function, `name file:line`), most first, ms. */
  top: Array<{ name: string; selfMs: number }>;
}

/** Sums `profile` for the frames whose script URL `matches`. */
export function profileShare(profile: CpuProfile, matches: (url: string) => boolean, topN = 12): ProfileShare {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  // Whether a node's stack (itself and its callers) holds a matching frame, once per node.
  const under = new Map<number, boolean>();
  const isUnder = (id: number): boolean => {
    const known = under.get(id);
    if (known !== undefined) return known;
    const node = byId.get(id);
    const up = parent.get(id);
    const v = node !== undefined && (matches(node.callFrame.url) || (up !== undefined && isUnder(up)));
    under.set(id, v);
    return v;
  };
  let total = 0;
  let idle = 0;
  let matched = 0;
  const self = new Map<string, number>();
  profile.samples.forEach((id, i) => {
    const dt = profile.timeDeltas[i] ?? 0;
    total += dt;
    const node = byId.get(id);
    if (node?.callFrame.functionName === '(idle)') idle += dt;
    if (!isUnder(id) || !node) return;
    matched += dt;
    const f = node.callFrame;
    const file = f.url.slice(f.url.lastIndexOf('/') + 1);
    const name = `${f.functionName || '(anonymous)'}${file ? ` ${file}:${f.lineNumber + 1}` : ''}`;
    self.set(name, (self.get(name) ?? 0) + dt);
  });
  const top = [...self.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, topN)
    .map(([name, us]) => ({ name, selfMs: us / 1000 }));
  return { totalMs: total / 1000, idleMs: idle / 1000, matchedMs: matched / 1000, top };
}

/**
 * The profile node wrote of the main thread of process `pid` in `dir`
 * (`CPU.<date>.<time>.<pid>.<thread>.<n>.cpuprofile`, thread 0; a worker's has its own number).
 */
export function readProfileOf(dir: string, pid: number): CpuProfile | undefined {
  const name = readdirSync(dir).find((f) => {
    const parts = f.split('.');
    return f.endsWith('.cpuprofile') && parts[3] === String(pid) && parts[4] === '0';
  });
  return name === undefined ? undefined : (JSON.parse(readFileSync(join(dir, name), 'utf8')) as CpuProfile);
}
