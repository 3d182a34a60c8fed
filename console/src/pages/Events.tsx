/**
 * The event log (docs/notifications.md, "The event log"): the newest 50 events (`GET /0/user/events/?latest=50`),
 * older pages on request (`from`, the smallest id shown), and events fired while the page is open put on top as the
 * live channel delivers them (`user-event`), each announced to screen readers. The log and the channel can both
 * hold an event; it is shown once.
 */
import { useEffect, useState } from 'preact/hooks';
import { call } from '../api.js';
import { live, type UserEvent } from '../live.js';
import { href } from '../router.js';
import { useLive } from '../session.js';
import { deviceName } from './fleet/names.js';
import { type LoggedEvent, listOf } from './fleet/rules-api.js';
import { say } from './fleet/say.js';

const PAGE = 50;

/** Newest first, each id once. */
function merged(a: LoggedEvent[], b: LoggedEvent[]): LoggedEvent[] {
  const byId = new Map<number, LoggedEvent>();
  for (const e of [...a, ...b]) if (!byId.has(e.id)) byId.set(e.id, e);
  return [...byId.values()].sort((x, y) => y.id - x.id);
}

export function Events() {
  const lv = useLive();
  const [events, setEvents] = useState<LoggedEvent[] | undefined>();
  const [more, setMore] = useState(false);
  const [error, setError] = useState<string | undefined>();
  const [busy, setBusy] = useState(false);
  const [announce, setAnnounce] = useState('');

  const page = async (from?: number) => {
    setBusy(true);
    const a = await call('GET', `/0/user/events/?latest=${PAGE}${from === undefined ? '' : `&from=${from}`}`);
    setBusy(false);
    const list = listOf<LoggedEvent>(a);
    if (!list) {
      setError(say(a));
      return;
    }
    setError(undefined);
    setMore(list.length === PAGE);
    setEvents((cur) => merged(cur ?? [], list));
  };

  useEffect(() => {
    void page();
    return live.onUserEvent((e: UserEvent) => {
      setEvents((cur) => merged([e], cur ?? []));
      setAnnounce(
        `New event: ${e.name}${e.test ? ' (test)' : ''}, on ${deviceName(e.deviceid, live.devices.get(e.deviceid))}.`,
      );
    });
  }, []);

  const oldest = events?.at(-1)?.id;
  return (
    <main>
      <h1>Events</h1>
      <p>
        What your <a href={href('rules')}>rules</a> fired, newest first. New ones appear here as they fire.
      </p>
      <p class="sr-only" role="status" aria-live="polite" aria-atomic="true" id="fl-events-live">
        {announce}
      </p>
      {!lv.connected && (
        <p class="note">The live channel is not connected: new events show when it is, or when you reload.</p>
      )}
      {error && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
      {events === undefined && !error && <p class="note">Loading…</p>}
      {events !== undefined && events.length === 0 && <p class="note">No events yet.</p>}
      {events !== undefined && events.length > 0 && (
        <div class="table-wrap fl-wrap">
          <table class="list fl-events">
            <caption class="sr-only">Events, newest first</caption>
            <thead>
              <tr>
                <th scope="col">When</th>
                <th scope="col">Rule</th>
                <th scope="col">Device</th>
                <th scope="col">Message</th>
                <th scope="col">Value</th>
                <th scope="col">Delivery</th>
              </tr>
            </thead>
            <tbody>
              {events.map((e) => (
                <tr key={e.id} data-event={e.id}>
                  <td>{new Date(e.time).toLocaleString()}</td>
                  <th scope="row">
                    {e.name}
                    {e.test && <span class="fl-badge fl-badge-test">test</span>}
                  </th>
                  <td>
                    {lv.devices.has(e.deviceid) ? (
                      <a href={href('devices', e.deviceid)}>{deviceName(e.deviceid, lv.devices.get(e.deviceid))}</a>
                    ) : (
                      e.deviceid
                    )}
                  </td>
                  <td>{e.message || '—'}</td>
                  <td>
                    {e.value !== null ? (
                      <code>{e.value}</code>
                    ) : e.value64 !== undefined ? (
                      <code>(base64) {e.value64}</code>
                    ) : (
                      '—'
                    )}
                  </td>
                  <td>{delivery(e)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      {events !== undefined && events.length > 0 && (
        <p>
          {more ? (
            <button type="button" class="secondary" disabled={busy} onClick={() => void page(oldest)}>
              Older
            </button>
          ) : (
            <span class="note">No older events.</span>
          )}
        </p>
      )}
    </main>
  );
}

function delivery(e: LoggedEvent): string {
  const parts: string[] = [];
  if (e.email) parts.push(`e-mail ${e.email}`);
  if (e.webhook) parts.push(`webhook ${e.webhook.state ?? 'pending'}`);
  return parts.join(', ') || '—';
}
