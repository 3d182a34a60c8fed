/**
 * The history of one variable (docs/api.md, "History"): `GET /0/devices/<id>/<type>/<name>?latest=N`, newest
 * first, and `&from=<id>` with the last id of a page for the page before it. Numbers are drawn as a time plot in
 * inline SVG (no library: the console stays small), anything else is a table; the plot has its table too.
 */
import { useEffect, useState } from 'preact/hooks';
import { call, explain } from '../../api.js';
import type { DeviceObject, VarType } from '../../live.js';
import { devicePath, shortStamp } from './paths.js';

export interface VarRef {
  type: VarType;
  name: string;
}

interface Entry {
  id: number;
  key: string;
  value: string;
  value64?: string;
  deleted?: boolean;
  by: string;
  timestamp: number;
}

const SIZES = [20, 50, 100, 500];

function entryText(e: Entry): string {
  if (e.deleted) return '(deleted)';
  if (e.value64 !== undefined) return `(base64) ${e.value64}`;
  return e.value;
}

function numeric(entries: Entry[]): boolean {
  return (
    entries.length > 0 &&
    entries.every((e) => !e.deleted && e.value64 === undefined && e.value.trim() !== '' && Number.isFinite(+e.value))
  );
}

export function History({
  id,
  dev,
  chosen,
  onChoose,
}: {
  id: string;
  dev: DeviceObject;
  chosen: VarRef | undefined;
  onChoose: (v: VarRef | undefined) => void;
}) {
  const [size, setSize] = useState(50);
  // The `from` of each page back from the newest: empty on the newest page.
  const [froms, setFroms] = useState<number[]>([]);
  const [entries, setEntries] = useState<Entry[] | undefined>();
  const [error, setError] = useState<string | undefined>();
  const [asTable, setAsTable] = useState(false);
  const from = froms[froms.length - 1];
  // On the newest page, a new version of the variable (from the live channel) reads the page again.
  const liveTime = chosen && from === undefined ? dev[chosen.type]?.[chosen.name]?.time : undefined;

  useEffect(() => setFroms([]), [chosen?.type, chosen?.name, size]);

  useEffect(() => {
    if (!chosen) {
      setEntries(undefined);
      return;
    }
    let gone = false;
    const query = `?latest=${size}${from === undefined ? '' : `&from=${from}`}`;
    void call('GET', devicePath(id, chosen.type, chosen.name) + query).then((a) => {
      if (gone) return;
      if (a.status !== 200) {
        setError(explain(a));
        setEntries(undefined);
        return;
      }
      setError(undefined);
      setEntries(JSON.parse(a.text) as Entry[]);
    });
    return () => {
      gone = true;
    };
  }, [id, chosen?.type, chosen?.name, size, from, liveTime]);

  const options: Array<[VarType, string[]]> = (['d', 's', 'meta'] as const).map((t) => {
    const names = Object.keys(dev[t] ?? {}).filter((n) => !(t === 'meta' && n === 'lastactivity'));
    if (chosen?.type === t && !names.includes(chosen.name)) names.push(chosen.name);
    return [t, names.sort()];
  });
  const groupLabel = { d: 'Device variables', s: 'Server variables', meta: 'Meta variables' };
  const title = chosen ? `History of ${chosen.type} ${chosen.name}` : 'History';
  const plot = entries !== undefined && numeric(entries);
  const last = entries?.[entries.length - 1];

  return (
    <section aria-labelledby="dv-history-h" class="dv-section" id="dv-history" tabIndex={-1}>
      <h2 id="dv-history-h">{title}</h2>
      <div class="dv-row">
        <label>
          Variable
          <select
            name="variable"
            aria-label="Variable"
            value={chosen ? `${chosen.type}/${chosen.name}` : ''}
            onChange={(e) => {
              const v = e.currentTarget.value;
              const at = v.indexOf('/');
              onChoose(at < 0 ? undefined : { type: v.slice(0, at) as VarType, name: v.slice(at + 1) });
            }}
          >
            <option value="">Choose a variable</option>
            {options.map(([t, names]) =>
              names.length === 0 ? null : (
                <optgroup key={t} label={groupLabel[t]}>
                  {names.map((n) => (
                    <option key={n} value={`${t}/${n}`}>
                      {n}
                    </option>
                  ))}
                </optgroup>
              ),
            )}
          </select>
        </label>
        <label>
          Entries per page
          <select
            name="latest"
            aria-label="Entries per page"
            value={String(size)}
            onChange={(e) => setSize(Number(e.currentTarget.value))}
          >
            {SIZES.map((n) => (
              <option key={n} value={String(n)}>
                {n}
              </option>
            ))}
          </select>
        </label>
      </div>
      {error && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
      {chosen && entries !== undefined && (
        <>
          <p class="note" role="status" data-testid="history-summary">
            {entries.length === 0
              ? from === undefined
                ? 'No history for this variable.'
                : 'No older entries.'
              : `${entries.length} ${entries.length === 1 ? 'entry' : 'entries'}, ${shortStamp(last?.timestamp)} to ${shortStamp(entries[0]?.timestamp)}${from === undefined ? ', the newest' : ''}.`}
          </p>
          {plot && <Plot entries={entries} title={title} />}
          {plot && (
            <button
              type="button"
              class="link"
              aria-expanded={asTable}
              aria-controls="dv-history-table"
              onClick={() => setAsTable(!asTable)}
            >
              {asTable ? 'Hide the table of values' : 'Show the values as a table'}
            </button>
          )}
          {entries.length > 0 && (!plot || asTable) && (
            <div class="table-wrap" id="dv-history-table">
              <table class="list" data-testid="history-table">
                <caption class="sr-only">{title}, newest first</caption>
                <thead>
                  <tr>
                    <th scope="col">Time</th>
                    <th scope="col">Value</th>
                    <th scope="col">Set by</th>
                  </tr>
                </thead>
                <tbody>
                  {entries.map((e) => (
                    <tr key={e.id}>
                      <td>{shortStamp(e.timestamp)}</td>
                      <td class="dv-value">{entryText(e)}</td>
                      <td>{e.by}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
          <nav class="dv-row" aria-label="History pages">
            <button
              type="button"
              class="secondary"
              disabled={froms.length === 0}
              onClick={() => setFroms(froms.slice(0, -1))}
            >
              Newer
            </button>
            <button
              type="button"
              class="secondary"
              disabled={entries.length < size || last === undefined}
              onClick={() => last && setFroms([...froms, last.id])}
            >
              Older
            </button>
          </nav>
        </>
      )}
    </section>
  );
}

/** Numbers over time: axes with their extremes, a line through the points; oldest on the left. */
function Plot({ entries, title }: { entries: Entry[]; title: string }) {
  const pts = [...entries].reverse().map((e) => ({ t: e.timestamp, v: +e.value }));
  const W = 640;
  const H = 260;
  const L = 64;
  const R = 16;
  const T = 16;
  const B = 40;
  const t0 = pts[0]!.t;
  const t1 = pts[pts.length - 1]!.t;
  let min = Infinity;
  let max = -Infinity;
  for (const p of pts) {
    min = Math.min(min, p.v);
    max = Math.max(max, p.v);
  }
  const x = (t: number) => (t1 === t0 ? (L + W - R) / 2 : L + ((t - t0) / (t1 - t0)) * (W - L - R));
  const y = (v: number) => (max === min ? (T + H - B) / 2 : T + ((max - v) / (max - min)) * (H - T - B));
  const line = pts.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(' ');
  const newest = pts[pts.length - 1]!;
  const desc =
    `${pts.length} values from ${shortStamp(t0)} to ${shortStamp(t1)}, between ${min} and ${max}; ` +
    `the newest is ${newest.v}.`;
  const fmt = (v: number) => String(Number(v.toPrecision(6)));
  return (
    <svg
      class="dv-plot"
      viewBox={`0 0 ${W} ${H}`}
      role="img"
      aria-labelledby="dv-plot-title dv-plot-desc"
      data-testid="history-plot"
    >
      <title id="dv-plot-title">{title}</title>
      <desc id="dv-plot-desc">{desc}</desc>
      <line class="dv-axis" x1={L} y1={T} x2={L} y2={H - B} />
      <line class="dv-axis" x1={L} y1={H - B} x2={W - R} y2={H - B} />
      <text x={L - 6} y={T + 4} text-anchor="end">
        {fmt(max)}
      </text>
      <text x={L - 6} y={H - B} text-anchor="end">
        {fmt(min)}
      </text>
      <text x={L} y={H - B + 18} text-anchor="start">
        {shortStamp(t0)}
      </text>
      <text x={W - R} y={H - B + 18} text-anchor="end">
        {shortStamp(t1)}
      </text>
      {pts.length > 1 && <polyline class="dv-line" points={line} />}
      {pts.length <= 200 &&
        pts.map((p, i) => (
          <circle key={i} class="dv-point" cx={x(p.t)} cy={y(p.v)} r={3}>
            <title>
              {shortStamp(p.t)}: {p.v}
            </title>
          </circle>
        ))}
    </svg>
  );
}
