/**
 * `config/bridge.example.yaml` promises every key at its default: it must load, and say exactly the defaults,
 * so that it cannot drift from `BridgeConfigSchema`.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { BridgeConfigSchema, defaultDataDir, loadBridgeConfig } from '../../bridge/config.js';
import { ROOT } from '../support/agent.js';

const FILE = join(ROOT, 'config/bridge.example.yaml');

describe('config/bridge.example.yaml', () => {
  it('loads, and gives the same config as no file at all', () => {
    const loaded = loadBridgeConfig({ configFile: FILE }, {});
    expect(loaded).toEqual(BridgeConfigSchema.parse({ dataDir: defaultDataDir({}) }));
    expect(loaded).toEqual(loadBridgeConfig({}, { CONFIGURATION_DIRECTORY: '/nonexistent' }));
  });

  it('writes out every key that has a default, with that value', () => {
    const written = parse(readFileSync(FILE, 'utf8')) as Record<string, unknown>;
    // dataDir is left commented out: its default comes from the environment ($STATE_DIRECTORY).
    const { dataDir: _dataDir, ...defaults } = BridgeConfigSchema.parse({ dataDir: '/unused' });
    expect(written).toEqual(defaults);
  });

  it('shows each optional key, commented out, in a form the schema accepts once uncommented', () => {
    // Uncomment `# key: value` lines (keeping their indentation, and the comments inside a commented block);
    // drop the prose.
    const text = readFileSync(FILE, 'utf8')
      .split('\n')
      .map((line) => {
        const m = /^(\s*)# (.*)$/.exec(line);
        if (!m) return line;
        return /^\s*([a-zA-Z]+:(?: .*)?|# .*)$/.test(m[2]!) ? `${m[1]}${m[2]}` : '';
      })
      .join('\n');
    const uncommented = parse(text) as Record<string, unknown>;
    const parsed = BridgeConfigSchema.safeParse(uncommented);
    expect(parsed.error?.issues ?? []).toEqual([]);
    const c = parsed.data!;
    expect(c.dataDir).toBe('/var/lib/devcloud-bridge');
    expect(c.http.certFile).toBeDefined();
    expect(c.http.keyFile).toBeDefined();
    expect(c.http.publicUrl).toBeDefined();
    expect(c.database.url).toBeDefined();
    expect(c.mqtt.url).toBeDefined();
    expect(c.mqtt.username).toBeDefined();
    expect(c.mqtt.passwordFile).toBeDefined();
    expect(c.mqtt.caFile).toBeDefined();
    expect(c.mail.outboxDir).toBeDefined();
    expect(c.mail.smtp).toMatchObject({ host: 'smtp.example.com', port: 587, secure: false, timeoutMs: 10_000 });
  });
});
