/**
 * A device's commands (docs/api.md, "Commands"): send one with `POST /0/devices/<id>` (`command`, `priority`,
 * `lifetime`), and follow them with `GET /0/devices/<id>/commands/`. Commands are not on the live channel, so the
 * list is read again every second while one of them is open (`queued`, `sent`, `running`), and no more once all
 * are final or the page is left.
 */
import { useEffect, useState } from 'preact/hooks';
import { call, explain } from '../../api.js';
import { devicePath, shortStamp } from './paths.js';

interface Command {
  id: string;
  command?: string;
  command64?: string;
  priority: number;
  state: 'queued' | 'sent' | 'running' | 'done' | 'failed' | 'expired';
  created: number;
  expires: number;
  finished: number | null;
  exitCode: number | null;
  signal: string | null;
  output: string | null;
  truncated: boolean;
  reason: string | null;
}

const OPEN = new Set(['queued', 'sent', 'running']);
const PRIORITIES = ['normal', 'urgent', 'most urgent'];
/** `lifetime` in ms (docs/api.md: 1 ms to 30 days, 24 hours by default). */
const LIFETIMES: Array<[string, string]> = [
  ['60000', '1 minute'],
  ['600000', '10 minutes'],
  ['3600000', '1 hour'],
  ['86400000', '24 hours'],
  ['604800000', '7 days'],
  ['2592000000', '30 days'],
];
const SHOWN = 20;

export function Commands({ id }: { id: string }) {
  const [list, setList] = useState<Command[] | undefined>();
  const [error, setError] = useState<string | undefined>();
  const [said, setSaid] = useState<string | undefined>();
  const [round, setRound] = useState(0);
  const [command, setCommand] = useState('');
  const [priority, setPriority] = useState('0');
  const [lifetime, setLifetime] = useState('86400000');
  const [busy, setBusy] = useState(false);

  // Read the list; again a second later while a command is open. A new round (after a send) replaces this one.
  useEffect(() => {
    let gone = false;
    let timer: number | undefined;
    const load = async () => {
      const a = await call('GET', `${devicePath(id, 'commands')}/?latest=${SHOWN}`);
      if (gone) return;
      if (a.status === 200) {
        const cmds = JSON.parse(a.text) as Command[];
        setList(cmds);
        setError(undefined);
        if (cmds.some((c) => OPEN.has(c.state))) timer = window.setTimeout(() => void load(), 1000);
      } else {
        setError(explain(a));
      }
    };
    void load();
    return () => {
      gone = true;
      clearTimeout(timer);
    };
  }, [id, round]);

  const send = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(undefined);
    const a = await call('POST', devicePath(id), { command, priority, lifetime });
    setBusy(false);
    if (a.status !== 200) {
      setError(explain(a));
      return;
    }
    setSaid(`Command ${command} sent.`);
    setCommand('');
    setRound((n) => n + 1);
  };

  return (
    <section aria-labelledby="dv-cmd-h" class="dv-section">
      <h2 id="dv-cmd-h">Commands</h2>
      <form class="dv-row dv-cmd-form" aria-label="Send a command" onSubmit={(e) => void send(e)}>
        <label class="dv-grow">
          Command
          <input
            type="text"
            name="command"
            required
            maxLength={4096}
            // Printable ASCII only (docs/api.md, "POST /0/devices/{id}").
            pattern="[\x20-\x7e]+"
            title="Printable ASCII characters"
            autocomplete="off"
            value={command}
            onInput={(e) => setCommand(e.currentTarget.value)}
          />
        </label>
        <label>
          Priority
          <select
            name="priority"
            aria-label="Priority"
            value={priority}
            onChange={(e) => setPriority(e.currentTarget.value)}
          >
            {PRIORITIES.map((p, i) => (
              <option key={p} value={String(i)}>
                {p}
              </option>
            ))}
          </select>
        </label>
        <label>
          Lifetime
          <select
            name="lifetime"
            aria-label="Lifetime"
            value={lifetime}
            onChange={(e) => setLifetime(e.currentTarget.value)}
          >
            {LIFETIMES.map(([ms, text]) => (
              <option key={ms} value={ms}>
                {text}
              </option>
            ))}
          </select>
        </label>
        <button type="submit" disabled={busy}>
          Send the command
        </button>
      </form>
      <p class="sr-only" role="status">
        {said}
      </p>
      {error && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
      <button type="button" class="link" onClick={() => setRound((n) => n + 1)}>
        Read the commands again
      </button>
      {list && list.length === 0 && <p class="note">No commands yet.</p>}
      {list && list.length > 0 && (
        <div class="table-wrap">
          <table class="list" data-testid="commands">
            <caption class="sr-only">The device's latest commands, newest first</caption>
            <thead>
              <tr>
                <th scope="col">Command</th>
                <th scope="col">State</th>
                <th scope="col">Output</th>
                <th scope="col">Priority</th>
                <th scope="col">Sent</th>
              </tr>
            </thead>
            <tbody>
              {list.map((c) => (
                <tr key={c.id} data-testid={`command-${c.id}`}>
                  <td class="dv-value">{c.command ?? `(base64) ${c.command64 ?? ''}`}</td>
                  <td>
                    <span class={`dv-cmd-state dv-cmd-${c.state}`} data-testid="command-state">
                      {c.state}
                    </span>
                    {c.exitCode !== null && c.exitCode !== 0 && <div class="note">exit status {c.exitCode}</div>}
                    {c.signal && <div class="note">{c.signal}</div>}
                  </td>
                  <td>
                    {c.output !== null && c.output !== '' && (
                      <pre class="dv-out" data-testid="command-output">
                        {c.output}
                      </pre>
                    )}
                    {c.truncated && <div class="note">The end of a longer output.</div>}
                    {c.reason && <div class="note">{c.reason}</div>}
                  </td>
                  <td>{PRIORITIES[c.priority] ?? c.priority}</td>
                  <td>{shortStamp(c.created)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
