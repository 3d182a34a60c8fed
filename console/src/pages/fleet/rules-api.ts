/**
 * The notification rules and their events as the bridge answers them (docs/notifications.md, "Rules" and "The event
 * log"), and the trigger error a `400` carries as JSON ("Limits and errors").
 */
import type { Answer } from '../../api.js';

export interface Rule {
  id: number;
  name: string;
  message: string;
  trigger: string;
  deviceid: string;
  email: boolean;
  webhook: string | null;
  webhookSecret: string | null;
  state: 'armed' | 'pending' | 'fired';
  created: number;
  updated: number;
  lastFired: number | null;
}

export interface LoggedEvent {
  id: number;
  type: 'user-event';
  rule: number | null;
  name: string;
  message: string;
  deviceid: string;
  trigger?: string;
  value: string | null;
  value64?: string;
  time: number;
  test: boolean;
  email?: 'pending' | 'sent' | 'failed' | 'skipped' | null;
  webhook?: { state: 'pending' | 'delivered' | 'failed'; attempts: number } | null;
}

export interface TriggerError {
  error: 'event-fail-trigger';
  position: number;
  line: number;
  column: number;
  message: string;
}

/** The trigger error of a `400`, when that is what it is. */
export function triggerError(a: Answer): TriggerError | undefined {
  if (a.status !== 400 || !a.text.startsWith('{')) return undefined;
  try {
    const e = JSON.parse(a.text) as Partial<TriggerError>;
    if (e.error === 'event-fail-trigger' && typeof e.position === 'number' && typeof e.message === 'string') {
      return e as TriggerError;
    }
  } catch {
    // Not JSON: a token, explained by the caller.
  }
  return undefined;
}

/** A JSON array of a `200`, or `undefined`. */
export function listOf<T>(a: Answer): T[] | undefined {
  if (a.status !== 200) return undefined;
  try {
    const v = JSON.parse(a.text) as unknown;
    return Array.isArray(v) ? (v as T[]) : undefined;
  } catch {
    return undefined;
  }
}
