/**
 * A device's sharing and unregistering, on its page (docs/api.md, "Sharing a device" and "DELETE /0/devices/{id}").
 * The owner shares it (`POST /0/devices/` with `auth` and `user`), sees the shares
 * (`GET /0/devices/<id>/users/`), takes one back (`DELETE /0/devices/<id>/users/<login>`) and unregisters it
 * (`DELETE /0/devices/<id>`, after a confirmation). A user it is shared with gets 403 on the list: they are told so,
 * and may remove it from their own devices (the same `DELETE`, which ends only their share).
 */
import { useEffect, useRef, useState } from 'preact/hooks';
import { call } from '../api.js';
import { go } from '../router.js';
import { useLive } from '../session.js';
import { deviceName } from './fleet/names.js';
import { say } from './fleet/say.js';

interface Share {
  login: string;
  granted: number;
}

/** Who the user is to the device, as the list of shares tells. */
type Role = { kind: 'loading' } | { kind: 'owner'; shares: Share[] } | { kind: 'shared' } | { kind: 'other' };

type Message = { text: string; error: boolean };

export function DeviceAdmin({ id }: { id: string }) {
  const live = useLive();
  const [role, setRole] = useState<Role>({ kind: 'loading' });
  const [listError, setListError] = useState<string | undefined>();
  const [login, setLogin] = useState('');
  const [message, setMessage] = useState<Message | undefined>();
  const [busy, setBusy] = useState(false);
  const [confirming, setConfirming] = useState(false);
  const confirmRef = useRef<HTMLButtonElement>(null);
  const startRef = useRef<HTMLButtonElement>(null);
  const name = deviceName(id, live.devices.get(id));
  const path = `/0/devices/${encodeURIComponent(id)}`;

  const load = async () => {
    const a = await call('GET', `${path}/users/`);
    if (a.status === 200) {
      try {
        setRole({ kind: 'owner', shares: JSON.parse(a.text) as Share[] });
        setListError(undefined);
      } catch {
        setListError('The bridge answered something the console cannot read.');
      }
    } else if (a.status === 403) {
      setRole({ kind: 'shared' });
    } else if (a.status === 404) {
      // Seen only nearby (not claimed), or gone.
      setRole({ kind: 'other' });
    } else {
      setListError(say(a));
    }
  };

  useEffect(() => {
    setRole({ kind: 'loading' });
    setConfirming(false);
    setMessage(undefined);
    void load();
  }, [id]);

  useEffect(() => {
    if (confirming) confirmRef.current?.focus();
  }, [confirming]);

  const share = async (e: Event) => {
    e.preventDefault();
    const who = login.trim();
    if (who === '') return;
    setBusy(true);
    setMessage(undefined);
    const a = await call('POST', '/0/devices/', { auth: id, user: who });
    setBusy(false);
    if (a.status === 200) {
      setMessage({ text: `Shared with ${who}.`, error: false });
      setLogin('');
      await load();
    } else {
      setMessage({ text: say(a), error: true });
    }
  };

  const takeBack = async (who: string) => {
    setBusy(true);
    setMessage(undefined);
    const a = await call('DELETE', `${path}/users/${encodeURIComponent(who)}`);
    setBusy(false);
    if (a.status === 200) {
      setMessage({ text: `${who} no longer has the device.`, error: false });
      await load();
    } else {
      setMessage({ text: say(a), error: true });
    }
  };

  const unregister = async () => {
    setBusy(true);
    setMessage(undefined);
    const a = await call('DELETE', path);
    setBusy(false);
    if (a.status === 200) {
      go('devices');
    } else {
      setConfirming(false);
      setMessage({ text: say(a), error: true });
    }
  };

  const cancel = () => {
    setConfirming(false);
    // Back where the user was, so that a keyboard user does not land at the top of the page.
    window.setTimeout(() => startRef.current?.focus(), 0);
  };

  const owner = role.kind === 'owner';
  const shared = role.kind === 'shared';
  return (
    <section class="fl-admin" aria-labelledby="fl-admin-title" data-device={id}>
      <h2 id="fl-admin-title">Sharing and registration</h2>
      {role.kind === 'loading' && !listError && (
        <p class="note" role="status">
          Loading…
        </p>
      )}
      {listError && (
        <p role="alert" class="error">
          {listError}
        </p>
      )}
      {shared && <p class="fl-offer">This device is shared with you. Only its owner may share it or unregister it.</p>}
      {role.kind === 'other' && <p class="note">Only the owner of this device may share it or unregister it.</p>}
      {owner && (
        <>
          <h3>Shared with</h3>
          {role.shares.length === 0 ? (
            <p class="note">Nobody else: only you have this device.</p>
          ) : (
            <div class="table-wrap fl-wrap">
              <table class="list">
                <caption class="sr-only">Users this device is shared with</caption>
                <thead>
                  <tr>
                    <th scope="col">User</th>
                    <th scope="col">Since</th>
                    <th scope="col">
                      <span class="sr-only">Action</span>
                    </th>
                  </tr>
                </thead>
                <tbody>
                  {role.shares.map((s) => (
                    <tr key={s.login} data-login={s.login}>
                      <th scope="row">{s.login}</th>
                      <td>{new Date(s.granted).toLocaleString()}</td>
                      <td>
                        <button
                          type="button"
                          class="secondary"
                          disabled={busy}
                          aria-label={`Take back the share of ${s.login}`}
                          onClick={() => void takeBack(s.login)}
                        >
                          Take back
                        </button>
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
          <form class="fl-inline" onSubmit={(e) => void share(e)}>
            <label>
              Share with (e-mail address of an account)
              <input
                type="email"
                name="user"
                autocomplete="off"
                required
                value={login}
                onInput={(e) => setLogin(e.currentTarget.value)}
              />
            </label>
            <button type="submit" disabled={busy}>
              Share
            </button>
          </form>
        </>
      )}
      {message && (
        <p role={message.error ? 'alert' : 'status'} class={message.error ? 'error' : 'note'}>
          {message.text}
        </p>
      )}
      {(owner || shared) && (
        <div class="fl-danger">
          <h3>{owner ? 'Unregister' : 'Remove from my devices'}</h3>
          <p class="note">
            {owner
              ? 'The device leaves your account: its server variables, its history, its commands and its shares go. ' +
                'It keeps its own variables and can be claimed again.'
              : 'The device leaves your list; its owner keeps it.'}
          </p>
          {!confirming ? (
            <button ref={startRef} type="button" class="fl-warn" disabled={busy} onClick={() => setConfirming(true)}>
              {owner ? 'Unregister…' : 'Remove…'}
            </button>
          ) : (
            <div class="fl-confirm" role="group" aria-labelledby="fl-confirm-q">
              <p id="fl-confirm-q">
                {owner ? `Unregister ${name}? This cannot be undone.` : `Remove ${name} from your devices?`}
              </p>
              <div class="fl-actions">
                <button
                  ref={confirmRef}
                  type="button"
                  class="fl-warn"
                  disabled={busy}
                  onClick={() => void unregister()}
                >
                  {owner ? 'Yes, unregister' : 'Yes, remove'}
                </button>
                <button type="button" class="secondary" onClick={cancel}>
                  Cancel
                </button>
              </div>
            </div>
          )}
        </div>
      )}
    </section>
  );
}
