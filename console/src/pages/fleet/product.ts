/**
 * What the frontend offers (docs/api.md, "GET /0/frontend"): its `nearby` and `registration` switches, read once
 * per page load and shared by every view, so that the console shows no nearby view and no claim where the
 * frontend has them off (docs/api.md, "16. Product configuration").
 */
import { useEffect, useState } from 'preact/hooks';
import { type Answer, call } from '../../api.js';

export interface FrontendInfo {
  id: string;
  name: string;
  nearby: boolean;
  registration: boolean;
}

export type Product =
  | { state: 'loading' }
  | { state: 'ready'; frontend: FrontendInfo }
  /** The bridge could not be asked: the console offers neither, and says why. */
  | { state: 'failed'; answer: Answer };

let asked: Promise<Product> | undefined;
let known: Product = { state: 'loading' };

async function ask(): Promise<Product> {
  const a = await call('GET', '/0/frontend');
  if (a.status === 200) {
    try {
      const f = JSON.parse(a.text) as FrontendInfo;
      if (typeof f.nearby === 'boolean' && typeof f.registration === 'boolean') return { state: 'ready', frontend: f };
    } catch {
      // Not JSON: answered as a failure below.
    }
  }
  return { state: 'failed', answer: a };
}

/** The frontend's switches; `loading` until the one request answers. A failure is asked again on the next mount. */
export function useProduct(): Product {
  const [p, setP] = useState<Product>(known);
  useEffect(() => {
    if (known.state === 'ready') return;
    asked ??= ask();
    let live = true;
    void asked.then((r) => {
      known = r;
      if (r.state === 'failed') asked = undefined;
      if (live) setP(r);
    });
    return () => {
      live = false;
    };
  }, []);
  return p;
}
