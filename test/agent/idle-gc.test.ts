/**
 * The agent's collection after a burst (agent/idle-gc.ts): one full collection once the heap has grown past its
 * size after the last one and no variable traffic was seen between two looks; never during traffic, never for a
 * heap that did not grow, and nothing at all without `--expose-gc`. With a real V8 collection, the heap a burst of
 * garbage took is given back.
 */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { IdleCollector } from '../../agent/idle-gc.js';

const MB = 1024 * 1024;

/** A heap and a work counter the test drives; `gc` brings the heap back to `live`. */
function fakeAgent() {
  const s = { heap: 20 * MB, live: 20 * MB, activity: 0, collections: 0 };
  const gc = () => {
    s.collections++;
    s.heap = s.live;
  };
  return { s, gc };
}

describe('IdleCollector', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('collects once after a burst, when a look finds no traffic since the one before', () => {
    vi.useFakeTimers();
    const { s, gc } = fakeAgent();
    const c = new IdleCollector({ activity: () => s.activity, heapBytes: () => s.heap, gc, everyMs: 2000 });
    c.start();
    // The burst: traffic at every look, the heap growing well past the threshold.
    for (let i = 0; i < 5; i++) {
      s.activity += 1000;
      s.heap += 2 * MB;
      vi.advanceTimersByTime(2000);
    }
    expect(s.collections).toBe(0);
    // The first look that finds no traffic since the one before collects.
    vi.advanceTimersByTime(2000);
    expect(s.collections).toBe(1);
    expect(s.heap).toBe(20 * MB);
    // Idle from then on, and the heap as it was after the collection: nothing more.
    vi.advanceTimersByTime(60_000);
    expect(s.collections).toBe(1);
    c.stop();
  });

  it('leaves a heap alone that grew less than the threshold, or shrank by itself', () => {
    const { s, gc } = fakeAgent();
    const c = new IdleCollector({ activity: () => s.activity, heapBytes: () => s.heap, gc, growthBytes: 4 * MB });
    s.heap += 3 * MB;
    expect(c.look()).toBe(false);
    // V8's own reducer took the heap below the reference: growth counts from there.
    s.heap = 16 * MB;
    expect(c.look()).toBe(false);
    s.heap = 20.5 * MB;
    expect(c.look()).toBe(true);
    expect(s.collections).toBe(1);
  });

  it('collects again at the next quiet looks while the heap stays large, at most maxTries times', () => {
    const { s } = fakeAgent();
    let frees = 3 * MB;
    const gc = () => {
      s.collections++;
      s.heap -= frees;
    };
    const c = new IdleCollector({ activity: () => s.activity, heapBytes: () => s.heap, gc, maxTries: 3 });
    // A burst took 12 MB; each collection frees only 3 MB of it.
    s.activity++;
    s.heap += 12 * MB;
    expect(c.look()).toBe(false); // traffic since the last look
    expect([c.look(), c.look(), c.look(), c.look()]).toEqual([true, true, true, false]);
    expect(s.heap).toBe(23 * MB);
    expect(s.collections).toBe(3);
    // Then what is live really grows by 6 MB, and collections free nothing: three tries, then that is the normal.
    frees = 0;
    s.activity++;
    s.heap = 26 * MB;
    expect(c.look()).toBe(false);
    expect([c.look(), c.look(), c.look(), c.look(), c.look()]).toEqual([true, true, true, false, false]);
    expect(s.collections).toBe(6);
    // The next burst is measured from there: 3 MB more is not worth a collection.
    s.activity++;
    s.heap = 29 * MB;
    expect([c.look(), c.look()]).toEqual([false, false]);
    expect(s.collections).toBe(6);
  });

  it('does nothing without a gc function (node without --expose-gc)', () => {
    vi.useFakeTimers();
    const { s } = fakeAgent();
    const c = new IdleCollector({ activity: () => s.activity, heapBytes: () => s.heap, gc: undefined });
    c.start();
    s.heap += 100 * MB;
    vi.advanceTimersByTime(60_000);
    expect(c.look()).toBe(false);
    expect(c.collections).toBe(0);
  });

  it('gives back the heap a burst of garbage took, in node started as the agent is (--expose-gc)', () => {
    // The built module in a node of its own: the test's worker has no --expose-gc.
    const script = `
      import { getHeapStatistics } from 'node:v8';
      import { IdleCollector } from './dist/agent/idle-gc.js';
      const heap = () => getHeapStatistics().total_heap_size;
      globalThis.gc();
      const c = new IdleCollector({ activity: () => 0, growthBytes: ${4 * MB} });
      const before = heap();
      let junk = [];
      for (let i = 0; i < 400000; i++) junk.push({ i, s: 'x' + i });
      junk = undefined;
      const grown = heap();
      const collected = c.look();
      console.log(JSON.stringify({ before, grown, collected, after: heap() }));
    `;
    const r = spawnSync(
      process.execPath,
      ['--expose-gc', '--max-semi-space-size=1', '--input-type=module', '-e', script],
      {
        cwd: join(import.meta.dirname, '../..'),
        encoding: 'utf8',
      },
    );
    expect(r.stderr).toBe('');
    const { before, grown, collected, after } = JSON.parse(r.stdout) as Record<string, number | boolean>;
    expect(grown).toBeGreaterThan((before as number) + 4 * MB);
    expect(collected).toBe(true);
    expect(after).toBeLessThan((before as number) + 4 * MB);
  });
});
