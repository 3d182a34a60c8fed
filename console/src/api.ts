/**
 * The console's only way to the bridge: the public REST API (docs/api.md), with the session cookie the bridge sets.
 * Every request carries the frontend the console was opened for (`?app=` in its address), as the official client
 * does, so that the console works on every frontend (decision 15).
 */
export interface Answer {
  status: number;
  /** The body as text: an answer token, a uuid, or JSON. */
  text: string;
}

/** The frontend named in the console's own address (`/console/?app=<uuid>`), if any. */
export function appId(): string | undefined {
  return new URLSearchParams(location.search).get('app') ?? undefined;
}

function withApp(path: string): string {
  const app = appId();
  if (app === undefined) return path;
  return `${path}${path.includes('?') ? '&' : '?'}app=${encodeURIComponent(app)}`;
}

/** One call: `fields` go as a form; the answer is never thrown, whatever its status (a network failure is 0). */
export async function call(
  method: 'GET' | 'POST' | 'DELETE',
  path: string,
  fields?: Record<string, string>,
): Promise<Answer> {
  const init: RequestInit = { method, credentials: 'same-origin', headers: {} };
  if (fields !== undefined) {
    init.body = new URLSearchParams(fields).toString();
    (init.headers as Record<string, string>)['content-type'] = 'application/x-www-form-urlencoded';
  }
  try {
    const res = await fetch(withApp(path), init);
    return { status: res.status, text: await res.text() };
  } catch {
    return { status: 0, text: 'network-fail' };
  }
}

/** A JSON answer of a `GET`, or `undefined` when it failed. */
export async function getJson<T>(path: string): Promise<T | undefined> {
  const a = await call('GET', path);
  if (a.status !== 200) return undefined;
  try {
    return JSON.parse(a.text) as T;
  } catch {
    return undefined;
  }
}

/** What to say to a person for an answer token (docs/api.md, "Answer tokens"). */
export function explain(a: Answer): string {
  if (a.status === 0) return 'The bridge cannot be reached. Check the network and try again.';
  if (a.status === 429) return 'Too many attempts. Wait a minute and try again.';
  const known: Record<string, string> = {
    'login-fail': 'Wrong e-mail address or password.',
    'signup-fail-already-exists': 'An account with this e-mail address exists already.',
    'signup-fail-no-email': 'Enter a valid e-mail address.',
    'signup-fail': 'Choose a password of at least 8 characters.',
    'no-session': 'Your session has ended. Log in again.',
    'claim-fail': 'The device could not be claimed.',
    'share-fail': 'The device could not be shared with that user.',
    'device-fail': 'The device or variable could not be changed.',
    'event-fail-device': 'Choose one of your devices.',
    'event-fail-webhook': 'The webhook must be an https:// address the bridge may reach.',
    'event-fail-limit': 'You have as many rules as you may.',
    'device-fwup-start-fail': 'The update could not start: the device must be connected and idle.',
    'firmware-fail': 'There is no update to cancel, or it is past the point of no return.',
  };
  return known[a.text] ?? `The bridge answered ${a.status} ${a.text.slice(0, 80)}`;
}
