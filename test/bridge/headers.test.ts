/**
 * The headers that keep browsers from misreading or framing the bridge's answers, over real HTTP:
 * `X-Content-Type-Options: nosniff` on every answer, whatever its status or type, and the Content Security Policy
 * with `X-Frame-Options` on HTML pages only (docs/api.md, Conventions). The recovery page itself is checked in
 * test/bridge/accounts.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type TestBridge, startTestBridge } from '../support/bridge.js';

let b: TestBridge;
beforeAll(async () => {
  b = await startTestBridge({ transport: 'http' });
});
afterAll(async () => {
  await b?.close();
});

async function headersOf(path: string, init: RequestInit = {}): Promise<{ status: number; headers: Headers }> {
  const r = await fetch(`${b.url}${path}`, init);
  await r.arrayBuffer();
  return { status: r.status, headers: r.headers };
}

describe('security headers', () => {
  it('sends nosniff on every answer, and the page policy only with HTML', async () => {
    const answers = [
      await headersOf('/0/openapi.json'),
      await headersOf('/healthz'),
      await headersOf('/metrics'),
      await headersOf('/0/user/'),
      await headersOf('/no/such/route'),
      await headersOf('/0/session/', { method: 'POST' }),
      await headersOf('/0/user/', { method: 'POST', headers: { origin: 'https://evil.example' } }),
      await headersOf('/0/devices/x/y/z', {
        method: 'POST',
        body: 'a=%ZZ',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
      }),
      // A path parameter the router cannot decode: answered by the router's error handler.
      await headersOf('/0/devices/%E0%A4%A'),
    ];
    expect(answers.map((a) => a.status)).toEqual([200, 200, 200, 404, 404, 201, 403, 401, 404]);
    for (const a of answers) {
      expect(a.headers.get('x-content-type-options')).toBe('nosniff');
      expect(a.headers.get('content-security-policy')).toBeNull();
      expect(a.headers.get('x-frame-options')).toBeNull();
    }
    const page = await headersOf('/0/session/recover?login=a%40example.com&token=t');
    expect(page.headers.get('content-type')).toMatch(/^text\/html/);
    expect(page.headers.get('content-security-policy')).toMatch(/frame-ancestors 'none'/);
    expect(page.headers.get('x-frame-options')).toBe('DENY');
    expect(page.headers.get('x-content-type-options')).toBe('nosniff');
  });
});
