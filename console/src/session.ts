/**
 * Who is logged in: `GET /0/user/` says (404 when no one is). The console keeps the answer and tells its listeners
 * when it changes (login, logout, a session that ended).
 */
import { useEffect, useState } from 'preact/hooks';
import { call, getJson } from './api.js';
import { live } from './live.js';

export interface UserInfo {
  login: string;
  confirmed: boolean;
  authcode: string;
}

type State = { kind: 'loading' } | { kind: 'anonymous' } | { kind: 'user'; user: UserInfo };

let state: State = { kind: 'loading' };
const listeners = new Set<() => void>();

function set(next: State): void {
  const wasUser = state.kind === 'user';
  state = next;
  if (next.kind === 'user' && !wasUser) live.start();
  if (next.kind !== 'user' && wasUser) live.stop();
  for (const fn of [...listeners]) fn();
}

/** Asks the bridge who the session is. */
export async function refresh(): Promise<void> {
  const user = await getJson<UserInfo>('/0/user/');
  set(user ? { kind: 'user', user } : { kind: 'anonymous' });
}

export async function logout(): Promise<void> {
  await call('POST', '/0/session/logout');
  set({ kind: 'anonymous' });
}

export function useSession(): State {
  const [s, setS] = useState(state);
  useEffect(() => {
    const on = () => setS(state);
    listeners.add(on);
    return () => listeners.delete(on);
  }, []);
  return s;
}

/** The live channel's devices, re-rendered at each change. */
export function useLive(): typeof live {
  const [, setTick] = useState(0);
  useEffect(() => live.subscribe(() => setTick((n) => n + 1)), []);
  return live;
}
