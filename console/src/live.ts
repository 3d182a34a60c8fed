/**
 * The live channel (docs/api.md, "Live channel"): a WebSocket on `/0/session/` with the subprotocol `thsq-user`,
 * as the official client opens it. It keeps the user's devices as the bridge last said they are (a snapshot, then
 * deltas) and tells its listeners; fired rules (`user-event`) go to their own listeners. It reconnects with backoff,
 * and a reconnect starts from a fresh snapshot.
 */
import { appId } from './api.js';

export interface VarRecord {
  value?: string;
  value64?: string;
  time: number;
  acked?: number;
  synced?: number;
  syncacked?: number;
  deleted?: boolean;
}
export type VarType = 'd' | 's' | 'meta';
export type DeviceObject = Partial<Record<VarType, Record<string, VarRecord>>>;

export interface UserEvent {
  id: number;
  type: 'user-event';
  rule: number | null;
  name: string;
  message: string;
  deviceid: string;
  value: string | null;
  time: number;
  test: boolean;
}

type Listener = () => void;

export class Live {
  devices = new Map<string, DeviceObject>();
  connected = false;
  private ws: WebSocket | undefined;
  private readonly listeners = new Set<Listener>();
  private readonly eventListeners = new Set<(e: UserEvent) => void>();
  private retryMs = 1000;
  private timer: number | undefined;
  private closed = false;

  start(): void {
    this.closed = false;
    this.open();
  }

  stop(): void {
    this.closed = true;
    clearTimeout(this.timer);
    this.ws?.close(1000);
    this.ws = undefined;
    this.devices = new Map();
    this.connected = false;
    this.emit();
  }

  /** Called at every change; returns the function that stops it. */
  subscribe(fn: Listener): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  onUserEvent(fn: (e: UserEvent) => void): () => void {
    this.eventListeners.add(fn);
    return () => this.eventListeners.delete(fn);
  }

  private emit(): void {
    for (const fn of [...this.listeners]) fn();
  }

  private open(): void {
    const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const app = appId();
    const path = app === undefined ? '/0/session/' : `/0/session/${encodeURIComponent(app)}`;
    const ws = new WebSocket(`${scheme}//${location.host}${path}`, 'thsq-user');
    this.ws = ws;
    ws.onopen = () => {
      this.retryMs = 1000;
      this.connected = true;
      ws.send(JSON.stringify({ delta: true, throttletime: 0 }));
      this.emit();
    };
    ws.onmessage = (m) => {
      if (typeof m.data === 'string') this.frame(m.data);
    };
    ws.onclose = () => {
      if (this.ws !== ws) return;
      this.connected = false;
      this.emit();
      if (this.closed) return;
      this.timer = window.setTimeout(() => this.open(), this.retryMs);
      this.retryMs = Math.min(this.retryMs * 2, 30_000);
    };
  }

  private frame(text: string): void {
    let msg: Record<string, unknown>;
    try {
      msg = JSON.parse(text) as Record<string, unknown>;
    } catch {
      return;
    }
    if (msg.devices && typeof msg.devices === 'object') {
      this.devices = new Map(Object.entries(msg.devices as Record<string, DeviceObject>));
    }
    if (msg.delta && typeof msg.delta === 'object') {
      const next = new Map(this.devices);
      for (const [id, types] of Object.entries(msg.delta as Record<string, DeviceObject>)) {
        const cur: DeviceObject = { ...next.get(id) };
        for (const type of ['d', 's', 'meta'] as const) {
          const recs = types[type];
          if (!recs) continue;
          const merged = { ...cur[type] };
          for (const [name, rec] of Object.entries(recs)) {
            if (rec.deleted) delete merged[name];
            else merged[name] = rec;
          }
          cur[type] = merged;
        }
        next.set(id, cur);
      }
      this.devices = next;
    }
    if (msg.events && typeof msg.events === 'object') {
      const next = new Map(this.devices);
      for (const [id, e] of Object.entries(msg.events as Record<string, { type?: string; device?: DeviceObject }>)) {
        if (e.type === 'device-claimed' && e.device) next.set(id, e.device);
        else if (e.type === 'device-removed') next.delete(id);
        else if (e.type === 'user-event') for (const fn of [...this.eventListeners]) fn(e as unknown as UserEvent);
      }
      this.devices = next;
    }
    this.emit();
  }
}

export const live = new Live();

/** A variable's value as text (`value64` shown as such). */
export function valueText(r: VarRecord | undefined): string {
  if (!r) return '';
  if (r.value !== undefined) return r.value;
  if (r.value64 !== undefined) return `(base64) ${r.value64}`;
  return '';
}
