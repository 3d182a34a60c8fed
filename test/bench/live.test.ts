/**
 * The live benchmark's own machinery: the baseline's frames are the bridge's with another device and value put
 * in, of the same size (bench/support/live-clients.ts), and a full collection forced in another node process
 * through its inspector frees what it no longer references (bench/support/inspector.ts).
 */
import { spawn } from 'node:child_process';
import { afterEach, describe, expect, it } from 'vitest';
import { attachInspector, inspectArg, type Inspector } from '../../bench/support/inspector.js';
import { fillFrame, markFrame } from '../../bench/support/live-clients.js';
import { freePort } from '../support/brokers.js';

const A = '7e070a2b-8501-44df-8ed4-a042f50c5c15';
const B = '14fd9974-1941-483b-bee5-35d998dcb499';

describe('baseline frames', () => {
  it("puts another device and value into the bridge's frame, every occurrence, at the same size", () => {
    const value = 'm0.17@1764072681438.125';
    const sent =
      `{"delta":{"${A}":{"d":{"temp":{"value":"${value}","time":1764072681440,"acked":0,"synced":1764072681440,` +
      `"syncacked":0}},"meta":{"unique":{"value":"${A}","time":1}}}}}`;
    const template = markFrame(sent, A, value);
    expect(fillFrame(template, A, value)).toBe(sent);
    const other = fillFrame(template, B, 'm0.18@1764072681439.250');
    expect(other).toHaveLength(sent.length);
    const parsed = JSON.parse(other) as { delta: Record<string, { d: { temp: { value: string } }; meta: object }> };
    expect(Object.keys(parsed.delta)).toEqual([B]);
    expect(parsed.delta[B]!.d.temp.value).toBe('m0.18@1764072681439.250');
    expect(parsed.delta[B]!.meta).toEqual({ unique: { value: B, time: 1 } });
  });

  it('escapes a value that needs it', () => {
    const template = markFrame(`{"delta":{"${A}":{"d":{"x":{"value":"v"}}}}}`, A, 'v');
    expect(JSON.parse(fillFrame(template, B, 'a"b\\c'))).toEqual({ delta: { [B]: { d: { x: { value: 'a"b\\c' } } } } });
  });
});

describe('inspector', () => {
  let child: ReturnType<typeof spawn> | undefined;
  let inspector: Inspector | undefined;
  afterEach(() => {
    inspector?.close();
    child?.kill('SIGKILL');
  });

  it('forces a collection that frees what the process dropped, and reads its memory', async () => {
    const port = await freePort();
    // A million small objects, dropped at once: nothing in an idle process collects them by itself.
    const script =
      'let keep = Array.from({ length: 1e6 }, (_, i) => ({ i }));' +
      'setTimeout(() => { keep = null; process.stdout.write("dropped\\n"); }, 0); setInterval(() => {}, 1000);';
    child = spawn(process.execPath, [inspectArg(port), '-e', script], { stdio: ['ignore', 'pipe', 'ignore'] });
    await new Promise<void>((resolve) => child!.stdout!.once('data', () => resolve()));
    inspector = await attachInspector(port);
    const before = await inspector.memory();
    expect(before.heapUsed).toBeGreaterThan(30 * 1024 * 1024);
    await inspector.gc();
    const after = await inspector.memory();
    expect(after.heapUsed).toBeLessThan(before.heapUsed - 25 * 1024 * 1024);
    expect(after.rss).toBeGreaterThan(0);
  });
});
