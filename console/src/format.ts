/** How times and stamps are shown. */
export function ago(ms: number, now = Date.now()): string {
  const s = Math.round((now - ms) / 1000);
  if (s < 5) return 'just now';
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86_400) return `${Math.round(s / 3600)} h ago`;
  return new Date(ms).toLocaleString();
}

/** A stamp: `—` for 0 (never), else the local time. */
export function stamp(ms: number | undefined): string {
  return ms === undefined || ms === 0 ? '—' : new Date(ms).toLocaleString();
}
