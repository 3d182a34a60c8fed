/**
 * One device (docs/api.md, "Devices"): what the live channel says of it, its variables with their stamps, the
 * history of one variable, its commands and its firmware; sharing and unregistering at the bottom.
 */
import { useState } from 'preact/hooks';
import { valueText } from '../live.js';
import { href } from '../router.js';
import { ago } from '../format.js';
import { useLive } from '../session.js';
import { DeviceAdmin } from './DeviceAdmin.js';
import { Commands } from './device/Commands.js';
import { DeviceFirmware } from './device/DeviceFirmware.js';
import { History, type VarRef } from './device/History.js';
import { Vars } from './device/Vars.js';

export function Device({ id }: { id: string }) {
  const live = useLive();
  const [chosen, setChosen] = useState<VarRef | undefined>();
  const dev = live.devices.get(id);
  const back = (
    <p class="dv-back">
      <a href={href('devices')}>All devices</a>
    </p>
  );
  if (!dev) {
    return (
      <main>
        {back}
        <h1>Device {id}</h1>
        {live.connected ? (
          <p role="alert" class="error">
            None of your devices has this id.
          </p>
        ) : (
          <p class="note" role="status">
            Connecting to the live channel…
          </p>
        )}
      </main>
    );
  }
  const state = valueText(dev.meta?.state) || 'unknown';
  const last = Number(valueText(dev.meta?.lastactivity));
  const showHistory = (v: VarRef) => {
    setChosen(v);
    // The history section is further down: take the reader (and the keyboard focus) there.
    requestAnimationFrame(() => document.getElementById('dv-history')?.focus());
  };
  return (
    <main class="dv">
      {back}
      <h1>{valueText(dev.meta?.name) || id}</h1>
      <dl class="dv-facts" data-testid="device-facts">
        <div>
          <dt>State</dt>
          <dd>
            <span class={`state state-${state}`} data-testid="device-state">
              {state}
            </span>
          </dd>
        </div>
        <div>
          <dt>Last activity</dt>
          <dd data-testid="device-lastactivity">
            {Number.isFinite(last) && last > 0 ? <time dateTime={new Date(last).toISOString()}>{ago(last)}</time> : '—'}
          </dd>
        </div>
        <div>
          <dt>Firmware version</dt>
          <dd data-testid="device-fwversion">{valueText(dev.meta?.fwversion) || '—'}</dd>
        </div>
        <div>
          <dt>Platform</dt>
          <dd>{valueText(dev.meta?.platform) || '—'}</dd>
        </div>
        <div>
          <dt>Device id</dt>
          <dd class="dv-id">{id}</dd>
        </div>
      </dl>
      <Vars id={id} dev={dev} onHistory={showHistory} />
      <History id={id} dev={dev} chosen={chosen} onChoose={setChosen} />
      <Commands id={id} />
      <DeviceFirmware id={id} dev={dev} />
      <DeviceAdmin id={id} />
    </main>
  );
}
