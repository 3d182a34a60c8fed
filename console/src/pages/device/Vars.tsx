/**
 * A device's variables, live (docs/api.md, "Device objects and variable records"): `d` with its four stamps and
 * whether the device holds the version set, `s` with its one, `meta` read-only. A `d` or `s` variable is set with
 * `POST /0/devices/<id>/<type>/<name>`, synchronised with the same `POST` and no value (`d` only), and deleted with
 * `DELETE`; the live channel's deltas bring the new stamps, so nothing is read again after a change.
 */
import { useEffect, useRef, useState } from 'preact/hooks';
import { type Answer, call, explain } from '../../api.js';
import { type DeviceObject, type VarRecord, valueText } from '../../live.js';
import { type VarRef } from './History.js';
import { devicePath, shortStamp } from './paths.js';

type Editable = 'd' | 's';

/**
 * Where a `d` variable stands. `acked >= time`: the device holds this version (docs/api.md, "Knowing that a change
 * arrived"). `waitFrom` is the `time` the variable had when the user set it here: until a version newer than it
 * arrives, the row still shows the old one, which must not read as acknowledged.
 */
function dStatus(r: VarRecord, waitFrom: number | undefined): string {
  if (waitFrom !== undefined && r.time <= waitFrom) return 'sent, waiting for the device';
  if ((r.acked ?? 0) === 0 || (r.acked ?? 0) < r.time) return 'sent, waiting for the device';
  return 'acknowledged';
}

function syncStatus(r: VarRecord): string | undefined {
  const synced = r.synced ?? 0;
  if (synced === 0) return undefined;
  return (r.syncacked ?? 0) >= synced ? 'sync acknowledged' : 'sync sent, waiting for the device';
}

function sorted(recs: Record<string, VarRecord> | undefined): Array<[string, VarRecord]> {
  return Object.entries(recs ?? {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
}

export function Vars({ id, dev, onHistory }: { id: string; dev: DeviceObject; onHistory: (v: VarRef) => void }) {
  // For each `d` variable set here: the `time` it had before (-1 for a new one), until the new version shows.
  const [waiting, setWaiting] = useState<Record<string, number>>({});
  const [error, setError] = useState<string | undefined>();
  const [said, setSaid] = useState<string | undefined>();

  // A variable whose newer version has arrived is no longer waiting; tell once when the device has it.
  useEffect(() => {
    const left: Record<string, number> = {};
    let changed = false;
    for (const [name, from] of Object.entries(waiting)) {
      const r = dev.d?.[name];
      if (r && r.time > from) {
        changed = true;
        continue;
      }
      left[name] = from;
    }
    if (changed) setWaiting(left);
  }, [dev, waiting]);

  const act = async (what: () => Promise<Answer>, done: string): Promise<boolean> => {
    setError(undefined);
    const a = await what();
    if (a.status !== 200) {
      setError(explain(a));
      return false;
    }
    setSaid(done);
    return true;
  };

  const set = async (type: Editable, name: string, value: string): Promise<boolean> => {
    const before = dev[type]?.[name]?.time ?? -1;
    const ok = await act(
      () => call('POST', devicePath(id, type, name), { value }),
      type === 'd' ? `${name} sent to the device.` : `${name} set.`,
    );
    if (ok && type === 'd') setWaiting((w) => ({ ...w, [name]: before }));
    return ok;
  };
  const sync = (name: string) =>
    act(() => call('POST', devicePath(id, 'd', name)), `A sync of ${name} was sent to the device.`);
  const remove = (type: Editable, name: string) =>
    act(() => call('DELETE', devicePath(id, type, name)), `${name} deleted.`);

  return (
    <>
      <p class="sr-only" role="status">
        {said}
      </p>
      {error && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
      <section aria-labelledby="dv-d-h" class="dv-section">
        <h2 id="dv-d-h">Device variables</h2>
        <p class="note">
          Set here, sent to the device; the device acknowledges each version it stores. Set by the device, held here.
        </p>
        <VarList
          type="d"
          recs={dev.d}
          waiting={waiting}
          onSet={set}
          onSync={sync}
          onDelete={remove}
          onHistory={onHistory}
        />
        <AddVar type="d" onSet={set} />
      </section>
      <section aria-labelledby="dv-s-h" class="dv-section">
        <h2 id="dv-s-h">Server variables</h2>
        <p class="note">Kept on the bridge, never sent to the device.</p>
        <VarList type="s" recs={dev.s} waiting={waiting} onSet={set} onDelete={remove} onHistory={onHistory} />
        <AddVar type="s" onSet={set} />
      </section>
      <section aria-labelledby="dv-meta-h" class="dv-section">
        <h2 id="dv-meta-h">Meta variables</h2>
        <p class="note">What the device and the bridge say about the device; read-only.</p>
        <div class="table-wrap">
          <table class="list" data-testid="vars-meta">
            <caption class="sr-only">Meta variables</caption>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Value</th>
                <th scope="col">Set</th>
                <th scope="col">
                  <span class="sr-only">History</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {sorted(dev.meta).map(([name, r]) => (
                <tr key={name} data-testid={`var-meta-${name}`}>
                  <th scope="row">{name}</th>
                  <td class="dv-value">
                    {valueText(r)}
                    {name === 'lastactivity' && <span class="note"> ({shortStamp(Number(valueText(r)))})</span>}
                  </td>
                  <td>{shortStamp(r.time)}</td>
                  <td>
                    {name !== 'lastactivity' && (
                      <button
                        type="button"
                        class="link"
                        aria-label={`History of meta ${name}`}
                        onClick={() => onHistory({ type: 'meta', name })}
                      >
                        History
                      </button>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      </section>
    </>
  );
}

function VarList({
  type,
  recs,
  waiting,
  onSet,
  onSync,
  onDelete,
  onHistory,
}: {
  type: Editable;
  recs: Record<string, VarRecord> | undefined;
  waiting: Record<string, number>;
  onSet: (type: Editable, name: string, value: string) => Promise<boolean>;
  onSync?: (name: string) => Promise<boolean>;
  onDelete: (type: Editable, name: string) => Promise<boolean>;
  onHistory: (v: VarRef) => void;
}) {
  const rows = sorted(recs);
  if (rows.length === 0) return <p class="note">None yet.</p>;
  return (
    <ul class="dv-vars" data-testid={`vars-${type}`}>
      {rows.map(([name, r]) => (
        <VarItem
          key={name}
          type={type}
          name={name}
          r={r}
          waitFrom={waiting[name]}
          onSet={onSet}
          onSync={onSync}
          onDelete={onDelete}
          onHistory={onHistory}
        />
      ))}
    </ul>
  );
}

function VarItem({
  type,
  name,
  r,
  waitFrom,
  onSet,
  onSync,
  onDelete,
  onHistory,
}: {
  type: Editable;
  name: string;
  r: VarRecord;
  waitFrom: number | undefined;
  onSet: (type: Editable, name: string, value: string) => Promise<boolean>;
  onSync: ((name: string) => Promise<boolean>) | undefined;
  onDelete: (type: Editable, name: string) => Promise<boolean>;
  onHistory: (v: VarRef) => void;
}) {
  const [value, setValue] = useState('');
  const [busy, setBusy] = useState(false);
  const [confirming, setConfirming] = useState(false);
  const confirmRef = useRef<HTMLButtonElement>(null);
  const deleteRef = useRef<HTMLButtonElement>(null);
  useEffect(() => {
    if (confirming) confirmRef.current?.focus();
  }, [confirming]);

  const testid = `var-${type}-${name}`;
  const status = type === 'd' ? dStatus(r, waitFrom) : undefined;
  const sync = type === 'd' ? syncStatus(r) : undefined;
  const inputLabel = type === 'd' ? `New value for ${name}` : `New value for server variable ${name}`;

  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    if (await onSet(type, name, value)) setValue('');
    setBusy(false);
  };

  return (
    <li class="dv-var" data-testid={testid}>
      <div class="dv-var-head">
        <h3>{name}</h3>
        <span class="dv-value" data-testid={`${testid}-value`}>
          {valueText(r) === '' ? <em>(empty)</em> : valueText(r)}
        </span>
      </div>
      {status && (
        <p class={`dv-status ${status === 'acknowledged' ? 'dv-ok' : 'dv-wait'}`} data-testid={`${testid}-status`}>
          {status}
        </p>
      )}
      <dl class="dv-stamps">
        <div>
          <dt>Set</dt>
          <dd>{shortStamp(r.time)}</dd>
        </div>
        {type === 'd' && (
          <>
            <div>
              <dt>Acknowledged by the device</dt>
              <dd>{shortStamp(r.acked)}</dd>
            </div>
            <div>
              <dt>Synchronised</dt>
              <dd>{shortStamp(r.synced)}</dd>
            </div>
            <div>
              <dt>Sync acknowledged</dt>
              <dd>{shortStamp(r.syncacked)}</dd>
            </div>
          </>
        )}
      </dl>
      {sync && (
        <p class="note" data-testid={`${testid}-sync`}>
          {sync}
        </p>
      )}
      <form class="dv-set" onSubmit={(e) => void submit(e)}>
        <label>
          <span class="sr-only">{inputLabel}</span>
          <input
            type="text"
            name="value"
            placeholder="New value"
            value={value}
            onInput={(e) => setValue(e.currentTarget.value)}
          />
        </label>
        <button type="submit" disabled={busy} aria-label={`Set ${name}`}>
          Set
        </button>
      </form>
      <div class="dv-actions">
        <button
          type="button"
          class="secondary"
          aria-label={`History of ${name}`}
          onClick={() => onHistory({ type, name })}
        >
          History
        </button>
        {onSync && (
          <button
            type="button"
            class="secondary"
            aria-label={`Sync ${name}`}
            disabled={busy}
            onClick={() => {
              setBusy(true);
              void onSync(name).finally(() => setBusy(false));
            }}
          >
            Sync
          </button>
        )}
        {!confirming && (
          <button
            type="button"
            class="secondary"
            ref={deleteRef}
            aria-label={`Delete ${name}`}
            onClick={() => setConfirming(true)}
          >
            Delete
          </button>
        )}
      </div>
      {confirming && (
        <div class="dv-confirm" role="group" aria-label={`Confirm the deletion of ${name}`}>
          <p>
            Delete {name}?{type === 'd' ? ' The device deletes it too.' : ''}
          </p>
          <button
            type="button"
            ref={confirmRef}
            disabled={busy}
            onClick={() => {
              setBusy(true);
              void onDelete(type, name).finally(() => {
                setBusy(false);
                setConfirming(false);
              });
            }}
          >
            Yes, delete {name}
          </button>{' '}
          <button
            type="button"
            class="secondary"
            onClick={() => {
              setConfirming(false);
              requestAnimationFrame(() => deleteRef.current?.focus());
            }}
          >
            Cancel
          </button>
        </div>
      )}
    </li>
  );
}

function AddVar({
  type,
  onSet,
}: {
  type: Editable;
  onSet: (type: Editable, name: string, value: string) => Promise<boolean>;
}) {
  const [name, setName] = useState('');
  const [value, setValue] = useState('');
  const [busy, setBusy] = useState(false);
  const what = type === 'd' ? 'device variable' : 'server variable';
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    if (await onSet(type, name.trim(), value)) {
      setName('');
      setValue('');
    }
    setBusy(false);
  };
  return (
    <form class="dv-add" aria-label={`Add a ${what}`} onSubmit={(e) => void submit(e)}>
      <label>
        Name of a new {what}
        <input
          type="text"
          name="name"
          required
          autocomplete="off"
          value={name}
          onInput={(e) => setName(e.currentTarget.value)}
        />
      </label>
      <label>
        Value of the new {what}
        <input type="text" name="value" value={value} onInput={(e) => setValue(e.currentTarget.value)} />
      </label>
      <button type="submit" disabled={busy}>
        Add the {what}
      </button>
    </form>
  );
}
