/** Small statistics and the table every benchmark prints before its JSON line. */

/** The value below which `p` percent of the samples fall (nearest rank). */
export function percentile(samples: readonly number[], p: number): number {
  if (samples.length === 0) return NaN;
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1]!;
}

export function median(samples: readonly number[]): number {
  return percentile(samples, 50);
}

/** Rounds for display and for the JSON line, keeping a few significant digits. */
export function round(n: number, digits = 3): number {
  if (!Number.isFinite(n) || n === 0) return n;
  const scale = 10 ** Math.max(0, digits - Math.ceil(Math.log10(Math.abs(n))));
  return Math.round(n * scale) / scale;
}

export interface Row {
  figure: string;
  measured: string;
  baseline: string;
  ratio: string;
  target: string;
  met: boolean | undefined;
}

export function formatTable(rows: readonly Row[]): string {
  const head = ['figure', 'measured', 'baseline', 'ratio', 'target', 'met'];
  const cells = rows.map((r) => [
    r.figure,
    r.measured,
    r.baseline,
    r.ratio,
    r.target,
    r.met === undefined ? '' : r.met ? 'yes' : 'NO',
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i]!.length)));
  const line = (c: string[]) =>
    c
      .map((s, i) => s.padEnd(widths[i]!))
      .join('  ')
      .trimEnd();
  return [line(head), line(widths.map((w) => '-'.repeat(w))), ...cells.map(line)].join('\n');
}

export function mb(bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}
