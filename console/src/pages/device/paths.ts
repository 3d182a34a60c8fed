/** The device routes of docs/api.md ("Devices", "Commands", "Firmware"), with every segment encoded. */
export function devicePath(id: string, ...parts: string[]): string {
  return ['/0/devices', id, ...parts].map((p, i) => (i === 0 ? p : encodeURIComponent(p))).join('/');
}

/** A stamp as a short local time for a table cell; `—` for 0 or none (docs/api.md: `0` is "never"). */
export function shortStamp(ms: number | undefined): string {
  if (ms === undefined || ms === 0) return '—';
  const d = new Date(ms);
  const sameDay = d.toDateString() === new Date().toDateString();
  return sameDay ? d.toLocaleTimeString() : d.toLocaleString();
}
