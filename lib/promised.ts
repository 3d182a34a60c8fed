/**
 * The asynchronous face of a synchronous object: every method answers a promise of what it returned, and a
 * throw becomes a rejection. SQLite's stores are synchronous; the interface they share with PostgreSQL's is not
 * (bridge/store/types.ts).
 */
export type Promised<T> = {
  [K in keyof T]: T[K] extends (...args: infer A) => infer R ? (...args: A) => Promise<R> : T[K];
};

/** Wraps the methods of `target`'s class (and its ancestors'); other properties are read through. */
export function promised<T extends object>(target: T): Promised<T> {
  const out: Record<string, unknown> = {};
  for (let proto = Object.getPrototypeOf(target) as object | null; proto && proto !== Object.prototype;) {
    for (const name of Object.getOwnPropertyNames(proto)) {
      if (name === 'constructor' || name in out) continue;
      const desc = Object.getOwnPropertyDescriptor(proto, name);
      if (typeof desc?.value !== 'function') continue;
      const fn = desc.value as (...args: unknown[]) => unknown;
      out[name] = (...args: unknown[]) => {
        try {
          return Promise.resolve(fn.apply(target, args));
        } catch (err) {
          return Promise.reject(err instanceof Error ? err : new Error(String(err)));
        }
      };
    }
    proto = Object.getPrototypeOf(proto) as object | null;
  }
  for (const name of Object.keys(target)) {
    if (name in out) continue;
    Object.defineProperty(out, name, { get: () => (target as Record<string, unknown>)[name], enumerable: true });
  }
  return out as Promised<T>;
}
