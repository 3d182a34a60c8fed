/**
 * The configuration reference in docs/operations.md is generated from the zod schemas (`npm run docs:config`);
 * this keeps it from going stale when a key is added, removed, or given another default or range.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { AgentConfigSchema } from '../../agent/config.js';
import { BridgeConfigSchema } from '../../bridge/config.js';
import { DOC, ROOT, configReference, currentReference } from '../../scripts/gen-config-docs.js';

describe('the configuration reference of docs/operations.md', () => {
  it('is what scripts/gen-config-docs.ts generates from the schemas now (else: npm run docs:config)', async () => {
    const doc = readFileSync(join(ROOT, DOC), 'utf8');
    expect(currentReference(doc)).toBe(await configReference());
  });

  it('has a row for every key of both schemas, with its default', async () => {
    const text = await configReference();
    const rows = new Map(
      [...text.matchAll(/^\| `([^`]+)` +\| [^|]+\| ([^|]+?) +\|/gm)].map((m) => [m[1]!, m[2]!] as [string, string]),
    );
    // Spot checks against the parsed defaults, so that a generator that lost keys or defaults cannot pass.
    const agent = AgentConfigSchema.parse({ stateDir: '/x' });
    const bridge = BridgeConfigSchema.parse({ dataDir: '/x' });
    expect(rows.get('mqtt.keepaliveSec')).toBe(`\`${agent.mqtt.keepaliveSec}\``);
    expect(rows.get('firmware.health.commitTimeoutMs')).toBe(`\`${agent.firmware.health.commitTimeoutMs}\``);
    expect(rows.get('commands.maxOpen')).toBe(`\`${bridge.commands.maxOpen}\``);
    expect(rows.get('mail.smtp.timeoutMs')).toBe('`10000`');
    // Every key a parsed config holds has its row (or, for `rateLimits.login` and the like, its object has one).
    const keys = (o: object, prefix = ''): string[] =>
      Object.entries(o).flatMap(([k, v]) =>
        v && typeof v === 'object' && !Array.isArray(v) ? keys(v as object, `${prefix}${k}.`) : [prefix + k],
      );
    const missing = [...keys(agent), ...keys(bridge)].filter(
      (k) => !rows.has(k) && !rows.has(k.replace(/\.[^.]+$/, '')),
    );
    expect(missing).toEqual([]);
  });
});
