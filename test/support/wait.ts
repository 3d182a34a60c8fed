/**
 * Waiting on the real clock for something another process or socket will do: `check` is polled until it returns
 * a value other than `undefined` or `false`, which `until` resolves with; past the deadline it throws, naming what
 * it waited for.
 */
export async function until<T>(
  check: () => Promise<T | undefined | false> | T | undefined | false,
  what: string,
  ms = 20_000,
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
