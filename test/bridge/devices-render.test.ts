/**
 * The device collection body (`GET /0/devices/`, `GET /0/network/`): a small list is joined as a string, a large
 * one written straight into a buffer. Both must be the same JSON, multi-byte characters included.
 */
import { describe, expect, it } from 'vitest';
import { renderCollection } from '../../bridge/devices/view.js';

function entries(n: number): Array<readonly [string, string]> {
  return Array.from({ length: n }, (_, i) => {
    const device = { d: { name: { value: `gateway ${i} — café ☕ ${'x'.repeat(i % 7)}`, time: i } }, s: {}, meta: {} };
    return [`${i.toString(16).padStart(8, '0')}-0000-4000-8000-000000000000`, JSON.stringify(device)] as const;
  });
}

const text = (body: string | Buffer) => (typeof body === 'string' ? body : body.toString('utf8'));

describe('renderCollection', () => {
  it('joins a small list as a string', () => {
    const list = entries(3);
    const body = renderCollection(list);
    expect(typeof body).toBe('string');
    expect(JSON.parse(text(body))).toEqual(Object.fromEntries(list.map(([k, j]) => [k, JSON.parse(j)])));
    expect(renderCollection([])).toBe('{}');
  });

  it('writes a large list into one buffer, byte for byte the JSON the string would be', () => {
    const list = entries(5000);
    const body = renderCollection(list);
    expect(Buffer.isBuffer(body)).toBe(true);
    const expected = `{${list.map(([k, j]) => `${JSON.stringify(k)}:${j}`).join(',')}}`;
    expect((body as Buffer).equals(Buffer.from(expected, 'utf8'))).toBe(true);
    expect(Object.keys(JSON.parse(text(body)) as object)).toHaveLength(5000);
  });
});
