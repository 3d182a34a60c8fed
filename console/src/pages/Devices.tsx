/** The user's devices, live: state, last activity, firmware version (docs/api.md, "Live channel"). */
import { useLive } from '../session.js';
import { valueText } from '../live.js';
import { href } from '../router.js';
import { ago } from '../format.js';

export function Devices() {
  const live = useLive();
  const devices = [...live.devices.entries()];
  return (
    <main>
      <h1>Devices</h1>
      {!live.connected && (
        <p class="note" role="status">
          Connecting to the live channel…
        </p>
      )}
      {live.connected && devices.length === 0 && <p>No devices yet. Claim one from the nearby view.</p>}
      {devices.length > 0 && (
        <div class="table-wrap">
          <table class="list">
            <caption class="sr-only">Your devices</caption>
            <thead>
              <tr>
                <th scope="col">Device</th>
                <th scope="col">State</th>
                <th scope="col">Last activity</th>
                <th scope="col">Firmware</th>
              </tr>
            </thead>
            <tbody>
              {devices.map(([id, d]) => {
                const state = valueText(d.meta?.state) || 'unknown';
                const last = Number(valueText(d.meta?.lastactivity));
                return (
                  <tr key={id} data-device={id}>
                    <td>
                      <a href={href('devices', id)}>{valueText(d.meta?.name) || id}</a>
                    </td>
                    <td>
                      <span class={`state state-${state}`}>{state}</span>
                    </td>
                    <td>{Number.isFinite(last) && last > 0 ? ago(last) : '—'}</td>
                    <td>{valueText(d.meta?.fwversion) || '—'}</td>
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
