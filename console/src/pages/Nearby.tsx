/**
 * The devices near the user (docs/api.md, "GET /0/network/"), asked for every 2 s, each with a claim button
 * (`POST /0/devices/` with its auth code). Only where the frontend offers them: `nearby` off, no view;
 * `registration` off, no claim (docs/api.md, "GET /0/frontend").
 */
import { useEffect, useRef, useState } from 'preact/hooks';
import { call } from '../api.js';
import type { DeviceObject } from '../live.js';
import { valueText } from '../live.js';
import { ago } from '../format.js';
import { href } from '../router.js';
import { useLive } from '../session.js';
import { useProduct } from './fleet/product.js';
import { say } from './fleet/say.js';

const POLL_MS = 2000;

type Message = { text: string; error: boolean; device?: string };

export function Nearby() {
  const product = useProduct();
  if (product.state === 'loading') {
    return (
      <main>
        <h1>Nearby devices</h1>
        <p class="note" role="status">
          Loading…
        </p>
      </main>
    );
  }
  if (product.state === 'failed') {
    return (
      <main>
        <h1>Nearby devices</h1>
        <p role="alert" class="error">
          {say(product.answer)}
        </p>
      </main>
    );
  }
  if (!product.frontend.nearby) {
    return (
      <main>
        <h1>Nearby devices</h1>
        <p class="fl-offer" role="note">
          The nearby view is not offered on this site. Ask its operator for a device's auth code to claim it, or for a
          share from its owner.
        </p>
      </main>
    );
  }
  return <NearbyList canClaim={product.frontend.registration} />;
}

function NearbyList({ canClaim }: { canClaim: boolean }) {
  const live = useLive();
  const [near, setNear] = useState<Array<[string, DeviceObject]> | undefined>();
  const [failure, setFailure] = useState<string | undefined>();
  const [busy, setBusy] = useState<string | undefined>();
  const [message, setMessage] = useState<Message | undefined>();
  const inFlight = useRef(false);

  useEffect(() => {
    let stopped = false;
    const poll = async () => {
      // One request at a time: a slow bridge does not pile them up.
      if (inFlight.current) return;
      inFlight.current = true;
      const a = await call('GET', '/0/network/');
      inFlight.current = false;
      if (stopped) return;
      if (a.status !== 200) {
        setFailure(say(a));
        return;
      }
      try {
        setNear(Object.entries(JSON.parse(a.text) as Record<string, DeviceObject>));
        setFailure(undefined);
      } catch {
        setFailure('The bridge answered something the console cannot read.');
      }
    };
    void poll();
    const timer = window.setInterval(() => void poll(), POLL_MS);
    return () => {
      stopped = true;
      window.clearInterval(timer);
    };
  }, []);

  const claim = async (authcode: string) => {
    setBusy(authcode);
    setMessage(undefined);
    const a = await call('POST', '/0/devices/', { auth: authcode });
    setBusy(undefined);
    if (a.status === 201) setMessage({ text: 'Claimed. It is now one of your devices.', error: false, device: a.text });
    else setMessage({ text: say(a), error: true });
  };

  return (
    <main>
      <h1>Nearby devices</h1>
      <p>
        Devices that heard your phone in the last minutes. Until you claim one, it is only a device that says it is
        near: its values come from it, not from a device you know.
      </p>
      <details class="fl-help">
        <summary>How a device becomes nearby</summary>
        <p>
          Your phone broadcasts your authcode on the local network as a UDP datagram to port 590 (its 32 hex digits,
          optionally followed by a newline). A devcloud agent that hears it tells the bridge, and the device is near you
          for 5 minutes. Your authcode is on the <a href={href('account')}>Account</a> page; it changes every day.
        </p>
      </details>
      {!canClaim && (
        <p class="fl-offer" role="note">
          Claiming devices is not offered on this site.
        </p>
      )}
      {message && (
        <p role={message.error ? 'alert' : 'status'} class={message.error ? 'error' : 'note'}>
          {message.text} {message.device && <a href={href('devices', message.device)}>Open the device</a>}
        </p>
      )}
      {failure && (
        <p role="alert" class="error">
          {failure}
        </p>
      )}
      {near === undefined && !failure && (
        <p class="note" role="status">
          Looking for nearby devices…
        </p>
      )}
      {near !== undefined && near.length === 0 && (
        <p class="note" role="status">
          No device near you. Send your authcode from your phone, then wait a few seconds.
        </p>
      )}
      {near !== undefined && near.length > 0 && (
        <div class="table-wrap fl-wrap">
          <table class="list fl-nearby">
            <caption class="sr-only">Devices near you</caption>
            <thead>
              <tr>
                <th scope="col">Device</th>
                <th scope="col">State</th>
                <th scope="col">Last activity</th>
                <th scope="col">Firmware</th>
                <th scope="col">
                  <span class="sr-only">Action</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {near.map(([authcode, d]) => {
                const uuid = valueText(d.meta?.unique);
                const mine = uuid !== '' && live.devices.has(uuid);
                const name = valueText(d.meta?.name) || uuid || authcode;
                const state = valueText(d.meta?.state) || 'unknown';
                const last = Number(valueText(d.meta?.lastactivity));
                return (
                  <tr key={authcode} data-authcode={authcode}>
                    <th scope="row">
                      {mine ? <a href={href('devices', uuid)}>{name}</a> : name}
                      <span class={`fl-badge ${mine ? 'fl-badge-mine' : 'fl-badge-unverified'}`}>
                        {mine ? 'yours' : 'nearby, unverified'}
                      </span>
                      <span class="fl-sub">
                        auth code <code class="fl-code">{authcode}</code>
                      </span>
                    </th>
                    <td>
                      <span class={`state state-${state}`}>{state}</span>
                    </td>
                    <td>{Number.isFinite(last) && last > 0 ? ago(last) : '—'}</td>
                    <td>{valueText(d.meta?.fwversion) || '—'}</td>
                    <td>
                      {canClaim && !mine && (
                        <button
                          type="button"
                          disabled={busy !== undefined}
                          aria-label={`Claim ${name}`}
                          onClick={() => void claim(authcode)}
                        >
                          {busy === authcode ? 'Claiming…' : 'Claim'}
                        </button>
                      )}
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
    </main>
  );
}
