/**
 * A full garbage collection and the heap's figures in another node process, through its inspector (the process
 * started with `--inspect=127.0.0.1:<port>`): the DevTools protocol's `HeapProfiler.collectGarbage` and
 * `process.memoryUsage()` evaluated there. The process's code is not changed for it, and nothing is collected
 * until asked. One session is kept open from the first measurement to the last, so that what the session itself
 * costs the process is in every figure alike.
 */
import WebSocket from 'ws';
import { wsText } from './ws-text.js';

export interface HeapFigures {
  heapUsed: number;
  heapTotal: number;
  external: number;
  arrayBuffers: number;
  rss: number;
}

export interface Inspector {
  /** A full collection (twice, so that what the first one's finalizers freed goes too). */
  gc(): Promise<void>;
  memory(): Promise<HeapFigures>;
  close(): void;
}

/** The node option that opens the inspector on `port` (loopback only). */
export function inspectArg(port: number): string {
  return `--inspect=127.0.0.1:${port}`;
}

export async function attachInspector(port: number, timeoutMs = 10_000): Promise<Inspector> {
  const deadline = Date.now() + timeoutMs;
  let url: string | undefined;
  while (url === undefined) {
    try {
      const res = await fetch(`http://127.0.0.1:${port}/json/list`);
      const list = (await res.json()) as Array<{ webSocketDebuggerUrl?: string }>;
      url = list[0]?.webSocketDebuggerUrl;
    } catch {
      // Not listening yet.
    }
    if (url === undefined) {
      if (Date.now() > deadline) throw new Error(`no inspector on 127.0.0.1:${port}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  const ws = new WebSocket(url, { perMessageDeflate: false });
  await new Promise<void>((resolve, reject) => {
    ws.once('open', () => resolve());
    ws.once('error', reject);
  });
  let seq = 0;
  const waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  ws.on('message', (data) => {
    const m = JSON.parse(wsText(data)) as { id?: number; result?: unknown; error?: { message: string } };
    if (m.id === undefined) return;
    const w = waiting.get(m.id);
    if (!w) return;
    waiting.delete(m.id);
    if (m.error) w.reject(new Error(m.error.message));
    else w.resolve(m.result);
  });
  ws.on('close', () => {
    for (const w of waiting.values()) w.reject(new Error('the inspector closed'));
    waiting.clear();
  });
  const call = (method: string, params?: object) =>
    new Promise<unknown>((resolve, reject) => {
      const id = ++seq;
      waiting.set(id, { resolve, reject });
      ws.send(JSON.stringify({ id, method, params }));
    });
  return {
    async gc() {
      await call('HeapProfiler.collectGarbage');
      await call('HeapProfiler.collectGarbage');
    },
    async memory() {
      const r = (await call('Runtime.evaluate', {
        expression: 'JSON.stringify(process.memoryUsage())',
        returnByValue: true,
      })) as { result: { value: string } };
      return JSON.parse(r.result.value) as HeapFigures;
    },
    close() {
      ws.close();
    },
  };
}
