/**
 * The web console (issue 18, docs/console.md) as a browser gets it from a real bridge (HTTP on a free port, the
 * embedded broker): the files served with their own CSP and gzip, the first load's size as sent, and in Debian's
 * Chromium (test/support/browser.ts): sign up, log out, log in; the login form's labels and Tab order; the devices
 * list at a phone's width; the frontend named by `?app=`.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import http from 'node:http';
import { beforeAll, describe, expect, it } from 'vitest';
import { ProductConfig } from '../../bridge/store/types.js';
import { type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type ConsolePage, type TestBrowser, openBrowser, screenshots } from '../support/browser.js';
import { missing } from '../support/system.js';

const PASSWORD = 'correct horse battery';
/** The budget for the first load: what the bridge sends for the page, its script and its style. */
const FIRST_LOAD_BYTES = 200 * 1024;
/** What Chromium answers a 404 with on its console: the console asks `GET /0/user/` before anyone logs in. */
const NO_USER_YET = /status of 404/;

/** A GET over a plain socket: the status, the headers and the body exactly as sent (no decoding). */
function rawGet(
  base: string,
  path: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: http.IncomingHttpHeaders; bytes: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.get(new URL(path, base), { headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, bytes: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
  });
}

describe('the web console, served', () => {
  let bridge: LiveBridge;

  beforeAll(async () => {
    bridge = await startLiveBridge();
    return () => bridge.close();
  });

  it('serves the page, its script and its style with a CSP of their own, gzipped when the client takes it', async () => {
    for (const [path, type] of [
      ['/console/', 'text/html'],
      ['/console/app.js', 'text/javascript'],
      ['/console/style.css', 'text/css'],
    ] as const) {
      const plain = await rawGet(bridge.url, path);
      expect(plain.status, path).toBe(200);
      expect(plain.headers['content-type'], path).toMatch(new RegExp(`^${type}`));
      expect(plain.headers['content-encoding'], path).toBeUndefined();
      const csp = String(plain.headers['content-security-policy']);
      for (const directive of [
        "default-src 'self'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
      ])
        expect(csp, path).toContain(directive);
      const gz = await rawGet(bridge.url, path, { 'accept-encoding': 'gzip, deflate, br' });
      expect(gz.headers['content-encoding'], path).toBe('gzip');
      expect(gz.headers.vary, path).toMatch(/accept-encoding/i);
      expect(gz.bytes.length, path).toBeLessThan(plain.bytes.length);
      // The gzip is of the same file.
      const { gunzipSync } = await import('node:zlib');
      expect(gunzipSync(gz.bytes).equals(plain.bytes), path).toBe(true);
    }
    // Only the console's own files: not their gzip by name, nothing beside or above them.
    for (const path of ['/console/app.js.gz', '/console/nope.js', '/console/..%2Fpackage.json', '/console/main.tsx']) {
      const r = await rawGet(bridge.url, path);
      expect([r.status, r.bytes.toString()], path).toEqual([404, 'not found']);
    }
  });

  it(`sends the first load (page, script, style), gzipped, in under ${FIRST_LOAD_BYTES / 1024} KiB`, async () => {
    let total = 0;
    const sizes: Record<string, number> = {};
    for (const path of ['/console/', '/console/app.js', '/console/style.css']) {
      const r = await rawGet(bridge.url, path, { 'accept-encoding': 'gzip, deflate, br, zstd' });
      expect(r.status).toBe(200);
      sizes[path] = r.bytes.length;
      total += r.bytes.length;
    }
    expect(total, JSON.stringify(sizes)).toBeLessThan(FIRST_LOAD_BYTES);
  });
});

describe.skipIf(missing('chromium'))('the web console in Chromium', () => {
  let bridge: LiveBridge;
  let browser: TestBrowser;
  const shoot = screenshots('console');
  let user = 0;
  const newLogin = () => `console-${++user}-${randomUUID().slice(0, 8)}@example.com`;

  beforeAll(async () => {
    bridge = await startLiveBridge();
    browser = await openBrowser();
    return async () => {
      await browser.close();
      await bridge.close();
    };
  });

  /** A page of the console at `hash` (and `?app=` when given), once its first screen shows a heading. */
  async function open(hash: string, opts: { width?: number; app?: string } = {}): Promise<ConsolePage> {
    const p = await browser.page(opts.width === undefined ? {} : { width: opts.width });
    const query = opts.app === undefined ? '' : `?app=${opts.app}`;
    await p.page.goto(`${bridge.url}/console/${query}#/${hash}`);
    await p.page.getByRole('heading', { level: 1 }).waitFor();
    return p;
  }

  /** Signs up through the form of a page at #/signup; the console then shows the devices. */
  async function signUp(p: ConsolePage, login: string): Promise<void> {
    await p.page.getByRole('heading', { name: 'Create an account' }).waitFor();
    await p.page.getByLabel('E-mail address').fill(login);
    await p.page.getByLabel('Password').fill(PASSWORD);
    await p.page.getByRole('button', { name: 'Create an account' }).click();
    await p.page.getByRole('heading', { name: 'Devices' }).waitFor();
  }

  it('loads only its own three files and the API from the bridge, under the budget as Chromium asks for them', async () => {
    const p = await browser.page();
    const requests: Array<{ url: string; encoding: string }> = [];
    p.page.on('request', (r) => {
      void r.allHeaders().then((h) => requests.push({ url: r.url(), encoding: h['accept-encoding'] ?? '' }));
    });
    await p.page.goto(`${bridge.url}/console/#/login`);
    await p.page.getByRole('heading', { name: 'Log in' }).waitFor();
    await p.page.waitForLoadState('networkidle');
    const files = requests.filter((r) => new URL(r.url).pathname.startsWith('/console/'));
    expect(files.map((r) => new URL(r.url).pathname).sort()).toEqual([
      '/console/',
      '/console/app.js',
      '/console/style.css',
    ]);
    expect(
      requests.every((r) => r.url.startsWith(bridge.url)),
      'no other host',
    ).toBe(true);
    // What the bridge sends for them when asked as Chromium asks.
    let total = 0;
    for (const r of files) {
      const sent = await rawGet(bridge.url, new URL(r.url).pathname, { 'accept-encoding': r.encoding });
      expect(sent.headers['content-encoding']).toBe('gzip');
      total += sent.bytes.length;
    }
    expect(total).toBeLessThan(FIRST_LOAD_BYTES);
    await shoot(p.page, 'login');
    p.expectClean(NO_USER_YET);
    await p.close();
  });

  it('signs up, logs out, refuses a wrong password, logs in and out again', async () => {
    const login = newLogin();
    const p = await open('signup');
    await signUp(p, login);
    expect(await p.page.getByText(login).isVisible()).toBe(true);
    const frontend = (await bridge.bridge.store.defaultFrontend())!;
    expect(await bridge.bridge.store.userByLogin(frontend.id, login)).toBeDefined();
    await shoot(p.page, 'devices-empty');

    await p.page.getByRole('button', { name: 'Log out' }).click();
    await p.page.getByRole('heading', { name: 'Log in' }).waitFor();

    await p.page.getByLabel('E-mail address').fill(login);
    await p.page.getByLabel('Password').fill('not the password');
    await p.page.getByRole('button', { name: 'Log in' }).click();
    await p.page.getByRole('alert').getByText('Wrong e-mail address or password.').waitFor();

    await p.page.getByLabel('Password').fill(PASSWORD);
    await p.page.getByRole('button', { name: 'Log in' }).click();
    await p.page.getByRole('heading', { name: 'Devices' }).waitFor();
    // The session is the browser's cookie: a reload keeps the user logged in.
    await p.page.reload();
    await p.page.getByRole('heading', { name: 'Devices' }).waitFor();
    await p.page.getByRole('button', { name: 'Log out' }).click();
    await p.page.getByRole('heading', { name: 'Log in' }).waitFor();
    await p.page.reload();
    await p.page.getByRole('heading', { name: 'Log in' }).waitFor();
    // A wrong password answers 403, which Chromium logs as a failed load, as it does the 404 of no user.
    p.expectClean(NO_USER_YET, /status of 403/);
    await p.close();
  });

  it('labels the login form, and takes it from the keyboard alone in Tab order', async () => {
    const p = await open('login');
    // Each input is named by its label, as a screen reader says it (the accessibility tree, through Playwright).
    expect(await p.page.locator('main input').count()).toBe(2);
    const form = await p.page.locator('main form').ariaSnapshot();
    expect(form).toContain('textbox "E-mail address"');
    expect(form).toContain('textbox "Password"');
    /** What has the keyboard's focus, as the accessibility tree names it. */
    const focused = async () => (await p.page.locator(':focus').ariaSnapshot()).replace(/^- /, '').split(':')[0]!;
    const order: string[] = [];
    for (let i = 0; i < 3; i++) {
      await p.page.keyboard.press('Tab');
      order.push(await focused());
    }
    expect(order).toEqual(['textbox "E-mail address"', 'textbox "Password"', 'button "Log in"']);
    // Typing into what has the focus, and Enter, logs in: a user made through the API first.
    const login = newLogin();
    const c = bridge.client();
    expect((await c.post('/0/session/signup', { form: { login, password: PASSWORD } })).status).toBe(201);
    await p.page.keyboard.press('Shift+Tab');
    await p.page.keyboard.press('Shift+Tab');
    expect(await focused()).toBe('textbox "E-mail address"');
    await p.page.keyboard.type(login);
    await p.page.keyboard.press('Tab');
    await p.page.keyboard.type(PASSWORD);
    await p.page.keyboard.press('Enter');
    await p.page.getByRole('heading', { name: 'Devices' }).waitFor();
    p.expectClean(NO_USER_YET);
    await p.close();
  });

  it('shows the devices list at 360 px wide without scrolling sideways', async () => {
    const login = newLogin();
    const p = await open('signup', { width: 360 });
    await signUp(p, login);
    // Devices as the MQTT side writes them after a hello, one with a long name; claimed by the user through the API
    // with the page's own session, so that the live channel brings each to the open list.
    const store = bridge.bridge.store;
    const now = Date.now();
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const [id, authcode] = [randomUUID(), randomBytes(16).toString('hex')];
      ids.push(id);
      await store.write(async ({ devices }) => {
        await devices.touch(id, now);
        await devices.setAuthcode(id, authcode);
        await devices.setMeta(id, 'unique', id, now, 'device');
        await devices.setMeta(id, 'state', i % 2 ? 'disconnected' : 'connected', now, 'server');
        await devices.setMeta(id, 'fwversion', '2024.11.3-rc1', now, 'device');
        if (i === 0)
          await devices.setMeta(id, 'name', 'Greenhouse gateway at the far end of the garden', now, 'device');
      });
      const claimed = await p.context.request.post(`${bridge.url}/0/devices/`, { form: { auth: authcode } });
      expect(claimed.status()).toBe(201);
    }
    for (const id of ids) await p.page.locator(`[data-device="${id}"]`).waitFor();
    // The console's tests run in Node's types, without the DOM's: the expression goes as text.
    const widths = await p.page.evaluate<{ page: number; viewport: number; body: number }>(
      '({ page: document.documentElement.scrollWidth, viewport: window.innerWidth, body: document.body.scrollWidth })',
    );
    await shoot(p.page, 'devices-360px');
    expect(widths.page, JSON.stringify(widths)).toBeLessThanOrEqual(widths.viewport);
    expect(widths.body, JSON.stringify(widths)).toBeLessThanOrEqual(widths.viewport);
    p.expectClean(NO_USER_YET);
    await p.close();
  });

  it("follows the frontend's product configuration: no nearby view where nearby is off, no claim where registration is", async () => {
    const store = bridge.bridge.store;
    const frontend = async (config: Partial<ProductConfig>) => {
      const f = { id: randomUUID(), name: 'kiosk', config: ProductConfig.parse(config), isDefault: false };
      await store.createFrontend({ ...f, createdAt: Date.now() });
      return f.id;
    };
    const noNearby = await frontend({ nearby: false });
    const noClaim = await frontend({ nearby: true, registration: false });

    const p = await open('signup', { app: noNearby });
    await signUp(p, newLogin());
    await p.page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Nearby', exact: true }).click();
    await p.page.getByRole('heading', { name: 'Nearby devices' }).waitFor();
    await p.page.getByText('The nearby view is not offered on this site.').waitFor();
    expect(await p.page.getByRole('table').count()).toBe(0);
    p.expectClean(NO_USER_YET);
    await p.close();

    // A device that heard the user: listed, with no claim button.
    const login = newLogin();
    const q = await open('signup', { app: noClaim });
    await signUp(q, login);
    const userId = (await store.userByLogin(noClaim, login))!.id;
    const [id, authcode, now] = [randomUUID(), randomBytes(16).toString('hex'), Date.now()];
    await store.write(async ({ devices }) => {
      await devices.touch(id, now);
      await devices.setAuthcode(id, authcode);
      await devices.setMeta(id, 'unique', id, now, 'device');
      await devices.setMeta(id, 'state', 'connected', now, 'server');
      await devices.heard(id, userId, now);
    });
    await q.page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Nearby', exact: true }).click();
    const row = q.page.locator(`[data-authcode="${authcode}"]`);
    await row.waitFor();
    await q.page.getByText('Claiming devices is not offered on this site.').waitFor();
    expect(await row.getByRole('button').count()).toBe(0);
    await shoot(q.page, 'nearby-no-claim');
    q.expectClean(NO_USER_YET);
    await q.close();
  });

  it('signs up into the frontend that `?app=` names, and calls the API with it', async () => {
    const second = {
      id: randomUUID(),
      name: 'second',
      config: ProductConfig.parse({}),
      isDefault: false,
      createdAt: Date.now(),
    };
    await bridge.bridge.store.createFrontend(second);
    const login = newLogin();
    const p = await open('signup', { app: second.id });
    const calls: string[] = [];
    p.page.on('request', (r) => {
      const url = new URL(r.url());
      if (url.pathname.startsWith('/0/')) calls.push(`${url.pathname}?app=${url.searchParams.get('app')}`);
    });
    await signUp(p, login);
    const store = bridge.bridge.store;
    expect(await store.userByLogin(second.id, login)).toBeDefined();
    expect(await store.userByLogin((await store.defaultFrontend())!.id, login)).toBeUndefined();
    expect(calls.length).toBeGreaterThan(0);
    for (const c of calls) expect(c).toMatch(new RegExp(`app=${second.id}$`));
    // The address keeps `?app=` across the console's own navigation.
    await p.page.getByRole('link', { name: 'Account' }).click();
    expect(new URL(p.page.url()).searchParams.get('app')).toBe(second.id);
    p.expectClean(NO_USER_YET);
    await p.close();
  });
});
