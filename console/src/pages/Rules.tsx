/**
 * The user's notification rules (docs/notifications.md, "Rules"): the list with each rule's state (armed, pending,
 * fired), a form to make one or change one, a test (`POST /0/user/event/<id>` without fields) and removal. A
 * trigger the bridge cannot read comes back as JSON with where it is wrong; it is shown under the field, the place
 * marked. The list is read again when one of the user's rules fires (the live channel's `user-event`) and every
 * few seconds, since a rule's `for` runs out without any event.
 */
import { useEffect, useRef, useState } from 'preact/hooks';
import { call } from '../api.js';
import { ago } from '../format.js';
import { live } from '../live.js';
import { href } from '../router.js';
import { useLive } from '../session.js';
import { deviceName } from './fleet/names.js';
import { type Rule, type TriggerError, listOf, triggerError } from './fleet/rules-api.js';
import { say } from './fleet/say.js';

const REFRESH_MS = 5000;

type Message = { text: string; error: boolean };
/** The form: a new rule, or the rule of that number. */
type Editing = { kind: 'new' } | { kind: 'edit'; rule: Rule };

export function Rules() {
  const [rules, setRules] = useState<Rule[] | undefined>();
  const [loadError, setLoadError] = useState<string | undefined>();
  const [editing, setEditing] = useState<Editing | undefined>();
  const [message, setMessage] = useState<Message | undefined>();
  const [deleting, setDeleting] = useState<number | undefined>();
  const [busy, setBusy] = useState(false);
  const newRef = useRef<HTMLButtonElement>(null);

  const load = async () => {
    const a = await call('GET', '/0/user/event/');
    const list = listOf<Rule>(a);
    if (list) {
      setRules(list);
      setLoadError(undefined);
    } else {
      setLoadError(say(a));
    }
  };

  useEffect(() => {
    void load();
    const off = live.onUserEvent(() => void load());
    const timer = window.setInterval(() => {
      if (document.visibilityState === 'visible') void load();
    }, REFRESH_MS);
    return () => {
      off();
      window.clearInterval(timer);
    };
  }, []);

  const test = async (r: Rule) => {
    setBusy(true);
    setMessage(undefined);
    const a = await call('POST', `/0/user/event/${r.id}`);
    setBusy(false);
    setMessage(
      a.status === 201
        ? { text: `A test event of “${r.name}” was sent (event ${a.text}).`, error: false }
        : { text: say(a), error: true },
    );
  };

  const remove = async (r: Rule) => {
    setBusy(true);
    setMessage(undefined);
    const a = await call('DELETE', `/0/user/event/${r.id}`);
    setBusy(false);
    setDeleting(undefined);
    if (a.status === 200) {
      setMessage({ text: `The rule “${r.name}” was deleted. Its events stay in the log.`, error: false });
      if (editing?.kind === 'edit' && editing.rule.id === r.id) setEditing(undefined);
      await load();
    } else {
      setMessage({ text: say(a), error: true });
    }
  };

  const saved = async (text: string) => {
    setEditing(undefined);
    setMessage({ text, error: false });
    await load();
    newRef.current?.focus();
  };

  return (
    <main>
      <h1>Rules</h1>
      <p>
        A rule watches one of your devices and fires an event when its trigger holds: in the{' '}
        <a href={href('events')}>event log</a>, live in this console, and by e-mail or webhook if you ask.
      </p>
      {loadError && (
        <p role="alert" class="error">
          {loadError}
        </p>
      )}
      {message && (
        <p role={message.error ? 'alert' : 'status'} class={message.error ? 'error' : 'note'}>
          {message.text}
        </p>
      )}
      {editing === undefined && (
        <p>
          <button ref={newRef} type="button" onClick={() => setEditing({ kind: 'new' })}>
            New rule
          </button>
        </p>
      )}
      {editing && (
        <RuleForm
          key={editing.kind === 'new' ? 'new' : editing.rule.id}
          editing={editing}
          onSaved={(t) => void saved(t)}
          onCancel={() => setEditing(undefined)}
        />
      )}
      {rules === undefined && !loadError && (
        <p class="note" role="status">
          Loading…
        </p>
      )}
      {rules !== undefined && rules.length === 0 && <p class="note">No rules yet.</p>}
      {rules !== undefined && rules.length > 0 && (
        <div class="table-wrap fl-wrap">
          <table class="list fl-rules">
            <caption class="sr-only">Your rules</caption>
            <thead>
              <tr>
                <th scope="col">Rule</th>
                <th scope="col">State</th>
                <th scope="col">Trigger</th>
                <th scope="col">Device</th>
                <th scope="col">Delivery</th>
                <th scope="col">Last fired</th>
                <th scope="col">
                  <span class="sr-only">Actions</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {rules.map((r) => (
                <tr key={r.id} data-rule={r.id}>
                  <th scope="row">{r.name}</th>
                  <td>
                    <span class={`fl-badge fl-badge-${r.state}`}>{r.state}</span>
                  </td>
                  <td>
                    <code>{r.trigger}</code>
                  </td>
                  <td>
                    <DeviceLink id={r.deviceid} />
                  </td>
                  <td>{[r.email ? 'e-mail' : '', r.webhook ? 'webhook' : ''].filter(Boolean).join(', ') || '—'}</td>
                  <td>{r.lastFired ? ago(r.lastFired) : 'never'}</td>
                  <td>
                    {deleting === r.id ? (
                      <div class="fl-actions" role="group" aria-label={`Delete ${r.name}?`}>
                        <button type="button" class="fl-warn" disabled={busy} onClick={() => void remove(r)}>
                          Yes, delete
                        </button>
                        <button type="button" class="secondary" onClick={() => setDeleting(undefined)}>
                          Cancel
                        </button>
                      </div>
                    ) : (
                      <div class="fl-actions">
                        <button
                          type="button"
                          class="secondary"
                          aria-label={`Edit ${r.name}`}
                          onClick={() => setEditing({ kind: 'edit', rule: r })}
                        >
                          Edit
                        </button>
                        <button
                          type="button"
                          class="secondary"
                          disabled={busy}
                          aria-label={`Send a test of ${r.name}`}
                          onClick={() => void test(r)}
                        >
                          Send a test
                        </button>
                        <button
                          type="button"
                          class="secondary"
                          aria-label={`Delete ${r.name}`}
                          onClick={() => setDeleting(r.id)}
                        >
                          Delete
                        </button>
                      </div>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </main>
  );
}

function DeviceLink({ id }: { id: string }) {
  const live = useLive();
  const d = live.devices.get(id);
  return d ? (
    <a href={href('devices', id)}>{deviceName(id, d)}</a>
  ) : (
    <span title="Not among your devices now">{id}</span>
  );
}

const EXAMPLES = [
  'd.temp > 30',
  'd.temp > 30 for 10m',
  's.mode == "eco"',
  'd.door became "open"',
  'meta.fwname changed',
  'offline for 5m',
  'online',
  'firmware failed',
  'command failed',
];

function RuleForm({
  editing,
  onSaved,
  onCancel,
}: {
  editing: Editing;
  onSaved: (message: string) => void;
  onCancel: () => void;
}) {
  const live = useLive();
  const old = editing.kind === 'edit' ? editing.rule : undefined;
  const [name, setName] = useState(old?.name ?? '');
  const [message, setMessage] = useState(old?.message ?? '');
  const [trigger, setTrigger] = useState(old?.trigger ?? '');
  const devices = [...live.devices.keys()];
  const [deviceid, setDeviceid] = useState(old?.deviceid ?? devices[0] ?? '');
  const [email, setEmail] = useState(old?.email ?? false);
  const [webhook, setWebhook] = useState(old?.webhook ?? '');
  const [error, setError] = useState<string | undefined>();
  const [tError, setTError] = useState<(TriggerError & { text: string }) | undefined>();
  const [busy, setBusy] = useState(false);
  const nameRef = useRef<HTMLInputElement>(null);
  const triggerRef = useRef<HTMLInputElement>(null);
  const errorRef = useRef<HTMLParagraphElement>(null);

  useEffect(() => nameRef.current?.focus(), []);
  // A device chosen before the live channel listed any: the first one, once it does.
  useEffect(() => {
    if (deviceid === '' && devices[0] !== undefined) setDeviceid(devices[0]);
  }, [devices.length]);

  // The rule's device, even when it is not among the user's devices now, so that editing does not move the rule.
  const options = old && !live.devices.has(old.deviceid) ? [old.deviceid, ...devices] : devices;

  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(undefined);
    setTError(undefined);
    const fields: Record<string, string> = { name, message, trigger, deviceid, email: email ? 'true' : 'false' };
    // An empty webhook takes it off a rule; a new rule without one simply has none.
    if (webhook !== '' || old?.webhook) fields.webhook = webhook;
    const a = old
      ? await call('POST', `/0/user/event/${old.id}`, fields)
      : await call('POST', '/0/user/event/', fields);
    setBusy(false);
    if ((old && a.status === 200) || (!old && a.status === 201)) {
      onSaved(old ? `The rule “${name.trim()}” was changed.` : `The rule “${name.trim()}” was made. It is armed.`);
      return;
    }
    const te = triggerError(a);
    if (te) {
      setTError({ ...te, text: trigger });
      const at = Math.min(te.position, trigger.length);
      window.setTimeout(() => {
        triggerRef.current?.focus();
        triggerRef.current?.setSelectionRange(at, at);
      }, 0);
      return;
    }
    setError(say(a));
    window.setTimeout(() => errorRef.current?.focus(), 0);
  };

  const title = old ? `Edit the rule “${old.name}”` : 'New rule';
  return (
    <form class="fl-form" aria-labelledby="fl-rule-form-title" onSubmit={(e) => void submit(e)}>
      <h2 id="fl-rule-form-title">{title}</h2>
      <label>
        Name
        <input
          ref={nameRef}
          name="name"
          required
          maxLength={100}
          value={name}
          onInput={(e) => setName(e.currentTarget.value)}
        />
      </label>
      <label>
        Message (optional)
        <textarea
          name="message"
          rows={2}
          maxLength={1000}
          value={message}
          onInput={(e) => setMessage(e.currentTarget.value)}
        />
      </label>
      <label>
        Device
        <select name="deviceid" required value={deviceid} onChange={(e) => setDeviceid(e.currentTarget.value)}>
          {options.length === 0 && <option value="">No devices: claim one first</option>}
          {options.map((id) => (
            <option key={id} value={id}>
              {deviceName(id, live.devices.get(id))}
            </option>
          ))}
        </select>
      </label>
      <label>
        Trigger
        <input
          ref={triggerRef}
          name="trigger"
          required
          maxLength={500}
          spellcheck={false}
          autocomplete="off"
          class="fl-mono"
          aria-invalid={tError ? 'true' : undefined}
          aria-describedby={tError ? 'fl-trigger-error fl-trigger-help' : 'fl-trigger-help'}
          value={trigger}
          onInput={(e) => setTrigger(e.currentTarget.value)}
        />
      </label>
      {tError && (
        <div id="fl-trigger-error" class="fl-trigger-error" role="alert">
          <p class="error">
            At character {tError.position + 1}: {tError.message}
          </p>
          <pre aria-hidden="true">
            <code>
              {tError.text.slice(0, tError.position)}
              <mark>{tError.text.slice(tError.position, tError.position + 1) || ' '}</mark>
              {tError.text.slice(tError.position + 1)}
            </code>
          </pre>
        </div>
      )}
      <div id="fl-trigger-help" class="fl-help">
        <p>
          A condition on one variable of the device (<code>d.</code>, <code>s.</code> or <code>meta.</code> and its
          name), compared with a number or a quoted text, optionally held for a time (<code>for 10m</code>: s, m, h, d);
          or an event of the device. Examples:
        </p>
        <ul class="fl-examples">
          {EXAMPLES.map((x) => (
            <li key={x}>
              <code>{x}</code>
            </li>
          ))}
        </ul>
      </div>
      <label class="fl-check">
        <input type="checkbox" name="email" checked={email} onChange={(e) => setEmail(e.currentTarget.checked)} />
        E-mail me each event
      </label>
      <label>
        Webhook URL (optional, https://)
        <input
          type="url"
          name="webhook"
          inputMode="url"
          autocomplete="off"
          placeholder="https://hooks.example.com/devcloud"
          value={webhook}
          onInput={(e) => setWebhook(e.currentTarget.value)}
        />
      </label>
      {old?.webhookSecret && (
        <p class="note">
          The webhook's signing secret: <code class="fl-code">{old.webhookSecret}</code>
        </p>
      )}
      {error && (
        <p ref={errorRef} tabIndex={-1} role="alert" class="error">
          {error}
        </p>
      )}
      <div class="fl-actions">
        <button type="submit" disabled={busy || options.length === 0}>
          {old ? 'Save the rule' : 'Make the rule'}
        </button>
        <button type="button" class="secondary" onClick={onCancel}>
          Cancel
        </button>
      </div>
    </form>
  );
}
