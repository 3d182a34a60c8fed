/**
 * Hash routes (`#/devices/<id>`), so that the bridge serves one page at `/console/` and a reload or a shared link
 * lands where it was, with no route of the bridge's per page.
 */
import { useEffect, useState } from 'preact/hooks';

export function currentRoute(): string[] {
  const hash = location.hash.replace(/^#\/?/, '');
  return hash === '' ? [] : hash.split('/').map((p) => decodeURIComponent(p));
}

export function useRoute(): string[] {
  const [route, setRoute] = useState(currentRoute());
  useEffect(() => {
    const on = () => setRoute(currentRoute());
    window.addEventListener('hashchange', on);
    return () => window.removeEventListener('hashchange', on);
  }, []);
  return route;
}

export function go(...parts: string[]): void {
  location.hash = '#/' + parts.map((p) => encodeURIComponent(p)).join('/');
}

export function href(...parts: string[]): string {
  return '#/' + parts.map((p) => encodeURIComponent(p)).join('/');
}
