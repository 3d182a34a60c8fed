/**
 * The web console's whole journey (issue 18) in Debian's Chromium, against a real bridge (HTTP on a free port, its
 * embedded broker) and a real agent connected to it (test/support/agent.ts): a user signs up in the browser, reads
 * the authcode on the Account page and sends it to the agent as a phone does (a UDP datagram), sees the device in the
 * Nearby view and claims it there, opens it, sets a variable and watches the device acknowledge it with no reload,
 * plots a variable's history, sends a command and reads its output, updates the device's firmware to the end, makes
 * a rule and watches its event arrive on the open Events page. Each step is a test; they run in order and share the
 * page, as a person's visit would.
 *
 * Screenshots of the main pages go to test-output/console/journey/ (test/support/browser.ts prints the folder).
 */
import { createSocket } from 'node:dgram';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { type TestAgent, startAgent, tempDir } from '../support/agent.js';
import { type LiveBridge, startLiveBridge } from '../support/bridge.js';
import { type ConsolePage, type TestBrowser, openBrowser, screenshots } from '../support/browser.js';
import { type SigningKeys, addToCatalog, buildImage, makeKeys, metaOf } from '../support/firmware.js';
import { missing } from '../support/system.js';

const LOGIN = 'journey@example.com';
const PASSWORD = 'correct horse battery';
const IMAGE = 'acme/gateway/rootfs-5';
/** Chromium logs the console's `GET /0/user/` before the signup (404) as a failed load. */
const NO_USER_YET = /status of 404/;

/** The datagram a phone sends to the gateways on its network: the user's authcode and a newline (docs/agent.md). */
function udpSend(port: number, payload: string): Promise<void> {
  const s = createSocket('udp4');
  return new Promise((resolve, reject) =>
    s.send(payload, port, '127.0.0.1', (err) => {
      s.close();
      if (err) reject(err);
      else resolve();
    }),
  );
}

describe.skipIf(missing('chromium'))('the console, the whole journey, with a real agent', () => {
  let bridge: LiveBridge;
  let browser: TestBrowser;
  let agent: TestAgent;
  let keys: SigningKeys;
  let p: ConsolePage;
  let deviceId: string;
  const dirs: string[] = [];
  const shoot = screenshots('journey');
  /** The agent's flags: its platform, and the key and slots of its firmware updates. */
  let flags: Record<string, unknown>;
  let stateDir: string;
  /** The user's authcode, as the Account page shows it. */
  let authcode: string;

  const page = () => p.page;
  const heading = (name: string) => page().getByRole('heading', { name, level: 1 });
  /** A link of the main navigation. */
  const nav = (name: string) =>
    page().getByRole('navigation', { name: 'Main' }).getByRole('link', { name, exact: true });
  /** The REST API with the browser's own session cookie (its context's cookies), to check what a page shows. */
  const api = () => p.context.request;

  beforeAll(async () => {
    bridge = await startLiveBridge();
    keys = makeKeys(tempDir('devcloud-keys-'));
    stateDir = tempDir('devcloud-journey-');
    dirs.push(stateDir);
    flags = {
      platform: 'linux-x64',
      'firmware.publicKeys': [keys.publicFile],
      'firmware.slotsDir': join(stateDir, 'slots'),
    };
    agent = await startAgent({ mqttUrl: bridge.mqttUrl, stateDir, flags, level: 'info' });
    deviceId = agent.agent.identity.deviceId;
    const imageDir = tempDir('devcloud-image-');
    dirs.push(imageDir);
    await addToCatalog(
      bridge.bridge.store,
      buildImage({ name: IMAGE, version: 5, files: { 'app.txt': 'v5' } }, imageDir),
      { name: IMAGE, version: 5 },
      keys,
    );
    browser = await openBrowser();
    p = await browser.page();
    return async () => {
      await browser.close();
      await agent.stop();
      await bridge.close();
      for (const d of dirs) rmSync(d, { recursive: true, force: true });
    };
  });

  it('signs up in the browser', async () => {
    await page().goto(`${bridge.url}/console/#/signup`);
    await heading('Create an account').waitFor();
    await page().getByLabel('E-mail address').fill(LOGIN);
    await page().getByLabel('Password').fill(PASSWORD);
    await shoot(page(), 'signup');
    await page().getByRole('button', { name: 'Create an account' }).click();
    await heading('Devices').waitFor();
    await page().getByText('No devices yet').waitFor();
    await shoot(page(), 'devices-empty');
    p.expectClean(NO_USER_YET);
  });

  it("shows the user's authcode on the Account page", async () => {
    await nav('Account').click();
    await heading('Account').waitFor();
    const shown = await page().locator('[data-field="authcode"]').textContent();
    // The same as the user's record says (GET /0/user/, with the page's own session).
    const user = (await (await api().get(`${bridge.url}/0/user/`)).json()) as { authcode: string; login: string };
    expect(shown?.trim()).toBe(user.authcode);
    expect(await page().locator('[data-field="login"]').textContent()).toBe(LOGIN);
    authcode = user.authcode;
    await shoot(page(), 'account');
    p.expectClean();
  });

  it('sends the authcode to the agent as a phone would, and sees the device in the Nearby view', async () => {
    await nav('Nearby').click();
    await heading('Nearby devices').waitFor();
    await page().getByText('No device near you').waitFor();
    await udpSend(agent.agent.nearby.port!, `${authcode}\n`);
    // The view asks the bridge again every 2 s: the device shows with no reload.
    const row = page().locator(`[data-authcode="${agent.agent.identity.authcode}"]`);
    await row.waitFor({ timeout: 15_000 });
    await row.getByText('nearby, unverified').waitFor();
    await row.getByText('connected').waitFor();
    await shoot(page(), 'nearby');
    p.expectClean();
  });

  it('claims it there; the devices list has it', async () => {
    const row = page().locator(`[data-authcode="${agent.agent.identity.authcode}"]`);
    await row.getByRole('button', { name: `Claim ${deviceId}` }).click();
    await page().getByRole('status').getByText('Claimed. It is now one of your devices.').waitFor();
    // The live channel told the console: the row now says the device is the user's.
    await row.getByText('yours').waitFor();
    await nav('Devices').click();
    await heading('Devices').waitFor();
    const listed = page().locator(`[data-device="${deviceId}"]`);
    await listed.getByText('connected').waitFor();
    await shoot(page(), 'devices');
    p.expectClean();
  });

  it('opens the device', async () => {
    await page().getByRole('link', { name: deviceId }).click();
    await heading(deviceId).waitFor();
    await page().getByTestId('device-state').getByText('connected').waitFor();
    await page().getByRole('heading', { name: 'Device variables' }).waitFor();
    await shoot(page(), 'device');
    p.expectClean();
  });

  it('sets a variable and sees it go from sent to acknowledged, with no reload', async () => {
    // A mark on the page: a reload would lose it.
    await page().evaluate('window.journeyMark = 1');
    const reads: string[] = [];
    const onRequest = (r: { method: () => string; url: () => string }) => {
      if (r.method() === 'GET') reads.push(new URL(r.url()).pathname);
    };
    page().on('request', onRequest);
    // The device goes away first, so that the acknowledgement can only come later, over the live channel.
    await agent.stop();
    let restarted = false;
    const restart = async () => {
      restarted = true;
      agent = await startAgent({ mqttUrl: bridge.mqttUrl, stateDir, flags, level: 'info' });
    };
    onTestFinished(async () => {
      page().off('request', onRequest);
      if (!restarted) await restart();
    });
    await page().getByTestId('device-state').getByText('disconnected').waitFor();

    // `mode` `connected`: what a firmware update needs of the device (docs/agent.md).
    const add = page().getByRole('form', { name: 'Add a device variable' });
    await add.getByLabel('Name of a new device variable').fill('mode');
    await add.getByLabel('Value of the new device variable').fill('connected');
    await add.getByRole('button', { name: 'Add the device variable' }).click();
    const mode = page().getByTestId('var-d-mode');
    await mode.getByTestId('var-d-mode-value').getByText('connected').waitFor();
    await mode.getByTestId('var-d-mode-status').getByText('sent, waiting for the device').waitFor();
    await shoot(page(), 'variable-sent');

    await restart();
    await mode.getByTestId('var-d-mode-status').getByText('acknowledged', { exact: true }).waitFor({ timeout: 15_000 });
    await page().getByTestId('device-state').getByText('connected', { exact: true }).waitFor();
    await shoot(page(), 'variable-acknowledged');
    expect(await page().evaluate('window.journeyMark')).toBe(1);
    // Nothing about the device was read again: the acknowledgement came over the live channel.
    expect(reads.filter((path) => path.startsWith(`/0/devices/${deviceId}/d`))).toEqual([]);
    expect(reads.filter((path) => path === '/0/devices/' || path === `/0/devices/${deviceId}`)).toEqual([]);
    const local = await agent.client();
    try {
      expect((await local.get('d', 'mode')).value).toBe('connected');
    } finally {
      local.close();
    }
    p.expectClean();
  });

  it("plots a variable's history", async () => {
    // The device measures: three values of `d` `temp`, set on the gateway as its sensor code would.
    for (const v of ['19.5', '21', '20.25']) {
      await agent.agent.vars.set('d', 'temp', Buffer.from(v));
      await page().getByTestId('var-d-temp-value').getByText(v, { exact: true }).waitFor();
    }
    await page().getByRole('button', { name: 'History of temp' }).click();
    await page().getByRole('heading', { name: 'History of d temp' }).waitFor();
    const plot = page().getByTestId('history-plot');
    await plot.waitFor();
    expect(await plot.locator('circle').count()).toBe(3);
    expect(await plot.locator('desc').textContent()).toMatch(
      /^3 values .* between 19\.5 and 21; the newest is 20\.25\.$/,
    );
    await page().getByTestId('history-summary').getByText('3 entries').waitFor();
    await plot.scrollIntoViewIfNeeded();
    await shoot(page(), 'history');
    // The same values as a table, newest first.
    await page().getByRole('button', { name: 'Show the values as a table' }).click();
    const cells = page().getByTestId('history-table').locator('tbody td.dv-value');
    expect(await cells.allTextContents()).toEqual(['20.25', '21', '19.5']);
    p.expectClean();
  });

  it('sends a command and sees its output', async () => {
    const form = page().getByRole('form', { name: 'Send a command' });
    await form.getByLabel('Command').fill('ping');
    await form.getByLabel('Priority').selectOption({ label: 'urgent' });
    await form.getByLabel('Lifetime').selectOption({ label: '1 hour' });
    await form.getByRole('button', { name: 'Send the command' }).click();
    const row = page().getByTestId('commands').locator('tbody tr').first();
    await row.getByTestId('command-state').getByText('done').waitFor({ timeout: 15_000 });
    expect(await row.getByTestId('command-output').textContent()).toBe('pong');
    expect(await row.locator('td').nth(3).textContent()).toBe('urgent');
    await row.scrollIntoViewIfNeeded();
    await shoot(page(), 'commands');
    p.expectClean();
  });

  it('starts a firmware update and sees it finish', async () => {
    const section = page().getByTestId('device-firmware');
    const form = section.getByRole('form', { name: 'Start a firmware update' });
    await form.getByLabel('Firmware image').selectOption(IMAGE);
    await form.getByRole('button', { name: 'Start the update' }).click();
    await section.getByTestId('fw-final').getByText('Finished', { exact: false }).waitFor({ timeout: 30_000 });
    expect(await section.getByTestId('fw-state').textContent()).toBe('done');
    expect(await section.getByTestId('fw-name').textContent()).toBe(IMAGE);
    expect(await metaOf(bridge.bridge.store, deviceId, 'fwstate')).toBe('done');
    // The version the device reports now, shown live at the top of the page.
    await page().getByTestId('device-fwversion').getByText('5').waitFor();
    await section.scrollIntoViewIfNeeded();
    await shoot(page(), 'firmware-update');
    p.expectClean();
  });

  it('shows the firmware catalog', async () => {
    await nav('Firmware').click();
    await heading('Firmware').waitFor();
    await page().getByTestId('firmware-catalog').getByText(IMAGE).waitFor();
    await shoot(page(), 'firmware');
    p.expectClean();
  });

  it('creates a rule on the Rules page', async () => {
    await nav('Rules').click();
    await heading('Rules').waitFor();
    await page().getByRole('button', { name: 'New rule' }).click();
    const form = page().getByRole('form', { name: 'New rule' });
    await form.getByLabel('Name', { exact: true }).fill('Too warm');
    await form.getByLabel('Message (optional)').fill('The gateway is above 30 degrees.');
    await form.getByRole('combobox', { name: 'Device', exact: true }).selectOption(deviceId);
    // A trigger that does not parse is refused in place, with where.
    await form.getByLabel('Trigger', { exact: true }).fill('d.temp >');
    await form.getByRole('button', { name: 'Make the rule' }).click();
    await form.getByRole('alert').getByText('At character').waitFor();
    await form.getByLabel('Trigger', { exact: true }).fill('d.temp > 30');
    await form.getByRole('button', { name: 'Make the rule' }).click();
    const row = page().locator('[data-rule]').filter({ hasText: 'Too warm' });
    await row.waitFor();
    await row.getByText('armed').waitFor();
    await shoot(page(), 'rules');
    // The 400 of the trigger that did not parse, which Chromium logs as a failed load.
    p.expectClean(/status of 400/);
  });

  it('sees its event on the Events page as it fires, with no reload', async () => {
    await nav('Events').click();
    await heading('Events').waitFor();
    await page().getByText('No events yet.').waitFor();
    await page().evaluate('window.journeyMark = 2');
    // The device measures 31.5: the rule fires, and the live channel brings its event to the open page.
    await agent.agent.vars.set('d', 'temp', Buffer.from('31.5'));
    const row = page().locator('[data-event]').filter({ hasText: 'Too warm' });
    await row.waitFor({ timeout: 15_000 });
    await row.getByText('The gateway is above 30 degrees.').waitFor();
    await row.getByText('31.5').waitFor();
    await page().locator('#fl-events-live').getByText('New event: Too warm').waitFor();
    expect(await page().evaluate('window.journeyMark')).toBe(2);
    await shoot(page(), 'events');
    p.expectClean();
  });

  it("fits every page into a phone's width (360 px) with no sideways scroll, every control named", async () => {
    await page().setViewportSize({ width: 360, height: 740 });
    const wide: string[] = [];
    const unnamed: string[] = [];
    // The devices list with more devices and a long name: test/console/console.test.ts.
    for (const [hash, title] of [
      ['devices', 'Devices'],
      [`devices/${deviceId}`, deviceId],
      ['nearby', 'Nearby devices'],
      ['rules', 'Rules'],
      ['events', 'Events'],
      ['firmware', 'Firmware'],
      ['account', 'Account'],
    ] as const) {
      await page().evaluate(`location.hash = '#/${hash}'`);
      await heading(title).waitFor();
      // The console's tests run in Node's types, without the DOM's: the expression goes as text.
      const width = await page().evaluate<number>('document.documentElement.scrollWidth');
      // Every control has a name a screen reader can say (the accessibility tree, as Playwright reads it).
      const tree = await page().locator('body').ariaSnapshot();
      for (const line of tree.split('\n')) {
        if (/^\s*- (textbox|combobox|button|checkbox|link|spinbutton)\s*(\[[^\]]*\])?\s*(:.*)?$/.test(line))
          unnamed.push(`${hash}: ${line.trim()}`);
      }
      if (width > 360) {
        wide.push(`${hash}: ${width} px`);
        await shoot(page(), `360px-${hash.split('/')[0]}`);
      }
    }
    expect(wide).toEqual([]);
    expect(unnamed).toEqual([]);
    p.expectClean();
  });
});
