/**
 * A device's firmware update (docs/api.md, "Firmware"; docs/firmware.md, "On the gateway: the state machine"):
 * start one with `POST /0/devices/<id>/fw/<name>` from the images of the catalog that update from the device's
 * platform, cancel it with `DELETE /0/devices/<id>/fw`, and follow it on the live channel, where the device reports
 * `meta` `fwstate`, `fwprogress`, `fwname` and `fwerror`.
 */
import { useEffect, useState } from 'preact/hooks';
import { call, explain, getJson } from '../../api.js';
import { type DeviceObject, valueText } from '../../live.js';
import type { Image } from './catalog.js';
import { devicePath } from './paths.js';

/** docs/firmware.md: the final states, and the states after the switch, when a cancel is refused. */
const FINAL = new Set(['done', 'failed', 'rolledback', 'cancelled']);
const AFTER_SWITCH = new Set(['switching', 'restarting', 'committing', 'rollingback']);

const SAY: Record<string, string> = {
  idle: 'No update has run.',
  downloading: 'Downloading the image.',
  verifying: 'Checking the image and its signature.',
  installing: 'Installing into the spare slot.',
  switching: 'Switching to the new image.',
  restarting: 'Restarting on the new image.',
  committing: 'Checking that the new image works.',
  rollingback: 'Going back to the previous image.',
  done: 'The update is done: the new image runs.',
  failed: 'The update failed; nothing that runs changed.',
  cancelled: 'The update was cancelled; nothing that runs changed.',
  rolledback: 'The new image did not work: the previous one runs again.',
};

export function DeviceFirmware({ id, dev }: { id: string; dev: DeviceObject }) {
  const [images, setImages] = useState<Image[] | undefined>();
  const [chosen, setChosen] = useState('');
  const [error, setError] = useState<string | undefined>();
  const [said, setSaid] = useState<string | undefined>();
  const [busy, setBusy] = useState(false);

  useEffect(() => {
    let gone = false;
    void getJson<Image[]>('/0/firmware/').then((list) => {
      if (!gone) setImages(list ?? []);
    });
    return () => {
      gone = true;
    };
  }, []);

  const platform = valueText(dev.meta?.platform);
  const fwstate = valueText(dev.meta?.fwstate) || 'idle';
  const progress = Number(valueText(dev.meta?.fwprogress)) || 0;
  const fwname = valueText(dev.meta?.fwname);
  const fwerror = valueText(dev.meta?.fwerror);
  const mode = valueText(dev.d?.mode);
  const running = !FINAL.has(fwstate) && fwstate !== 'idle';
  const fits = (images ?? []).filter((i) => i.info.platforms.from.includes(platform));
  const pick = chosen !== '' && fits.some((i) => i.name === chosen) ? chosen : (fits[0]?.name ?? '');

  const start = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(undefined);
    // The name keeps its slashes: it is a path below `fw/` (docs/api.md).
    const a = await call('POST', `${devicePath(id, 'fw')}/${pick.split('/').map(encodeURIComponent).join('/')}`);
    setBusy(false);
    if (a.status === 200) setSaid(`The update to ${pick} was sent to the device.`);
    else if (a.text === 'device-fwup-name-fail') setError(`The catalog has no image ${pick} any more.`);
    else setError(explain(a));
  };
  const cancel = async () => {
    setBusy(true);
    setError(undefined);
    const a = await call('DELETE', devicePath(id, 'fw'));
    setBusy(false);
    if (a.status === 200) setSaid('The cancel was sent to the device.');
    else setError(explain(a));
  };

  return (
    <section aria-labelledby="dv-fw-h" class="dv-section" data-testid="device-firmware">
      <h2 id="dv-fw-h">Firmware update</h2>
      <div class="dv-fw-state" role="status" aria-live="polite">
        <p>
          <strong>State: </strong>
          <span class={`dv-fw-${fwstate}`} data-testid="fw-state">
            {fwstate}
          </span>
          {fwname && (
            <>
              {' '}
              (<span data-testid="fw-name">{fwname}</span>)
            </>
          )}
          . {SAY[fwstate] ?? ''}
        </p>
        {FINAL.has(fwstate) && (
          <p class={fwstate === 'done' ? 'dv-ok' : 'error'} data-testid="fw-final">
            {fwstate === 'done'
              ? `Finished: the device runs firmware version ${valueText(dev.meta?.fwversion) || '—'}.`
              : `Ended: ${fwstate}.`}
          </p>
        )}
      </div>
      {fwerror && (
        <p class="error" data-testid="fw-error">
          {fwerror}
        </p>
      )}
      {(running || fwstate === 'done') && (
        <div class="dv-fw-progress">
          <label for="dv-fw-progress">Download progress</label>
          <progress id="dv-fw-progress" max={100} value={progress} data-testid="fw-progress">
            {progress} %
          </progress>
          <span aria-hidden="true">{progress} %</span>
        </div>
      )}
      {images === undefined ? (
        <p class="note">Reading the catalog…</p>
      ) : fits.length === 0 ? (
        <p class="note">The catalog has no image that updates a device of platform {platform || '(unknown)'}.</p>
      ) : (
        <form class="dv-row" aria-label="Start a firmware update" onSubmit={(e) => void start(e)}>
          <label class="dv-grow">
            Firmware image
            <select
              name="image"
              aria-label="Firmware image"
              value={pick}
              onChange={(e) => setChosen(e.currentTarget.value)}
            >
              {fits.map((i) => (
                <option key={`${i.name}@${i.version}`} value={i.name}>
                  {i.name} (version {i.version})
                </option>
              ))}
            </select>
          </label>
          <button type="submit" disabled={busy || running || pick === ''}>
            Start the update
          </button>
        </form>
      )}
      {mode !== 'connected' && !running && (
        <p class="note" data-testid="fw-mode">
          The device takes an update only while its d variable mode is connected (it is {mode || 'not set'}).
        </p>
      )}
      {running && (
        <button
          type="button"
          class="secondary"
          disabled={busy || AFTER_SWITCH.has(fwstate)}
          onClick={() => void cancel()}
        >
          Cancel the update
        </button>
      )}
      {running && AFTER_SWITCH.has(fwstate) && (
        <p class="note">Past the switch, an update can no longer be cancelled.</p>
      )}
      <p class="sr-only" role="status">
        {said}
      </p>
      {error && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
    </section>
  );
}
