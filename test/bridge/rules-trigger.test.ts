/**
 * The trigger language of notification rules (bridge/rules/trigger.ts, docs/notifications.md#the-trigger-language):
 * every form parses to its AST and formats back to text that parses to the same AST; bad inputs are errors at the
 * offending token; `holds` compares numbers as numbers and strings as strings, and a missing value satisfies
 * nothing; and no input, however mangled, makes the parser throw or point outside the text.
 */
import { seededRandom } from '../support/rng.js';
import { describe, expect, it } from 'vitest';
import {
  FOR_MAX_MS,
  TRIGGER_MAX_LENGTH,
  type Trigger,
  forMsOf,
  formatTrigger,
  holds,
  isLevel,
  parseTrigger,
  watchedVar,
} from '../../bridge/rules/trigger.js';

const num = (value: number) => ({ kind: 'number', value }) as const;
const str = (value: string) => ({ kind: 'string', value }) as const;
const d = (name: string) => ({ type: 'd', name }) as const;
const s = (name: string) => ({ type: 's', name }) as const;
const meta = (name: string) => ({ type: 'meta', name }) as const;

function parsed(text: string): Trigger {
  const result = parseTrigger(text);
  if (!result.ok) throw new Error(`${text}: ${JSON.stringify(result.error)}`);
  return result.trigger;
}

/** Each form, with the AST it parses to and its canonical text. */
const VALID: [string, Trigger, string][] = [
  ['d.temp > 30', { kind: 'compare', ref: d('temp'), op: '>', value: num(30), forMs: 0 }, 'd.temp > 30'],
  ['d.temp>30', { kind: 'compare', ref: d('temp'), op: '>', value: num(30), forMs: 0 }, 'd.temp > 30'],
  ['d.level <= -2.5', { kind: 'compare', ref: d('level'), op: '<=', value: num(-2.5), forMs: 0 }, 'd.level <= -2.5'],
  ['d.level>=-2.5', { kind: 'compare', ref: d('level'), op: '>=', value: num(-2.5), forMs: 0 }, 'd.level >= -2.5'],
  ['d.x < 1.5e3', { kind: 'compare', ref: d('x'), op: '<', value: num(1500), forMs: 0 }, 'd.x < 1500'],
  ['d.x < 2E-3', { kind: 'compare', ref: d('x'), op: '<', value: num(0.002), forMs: 0 }, 'd.x < 0.002'],
  ['d.x != 007', { kind: 'compare', ref: d('x'), op: '!=', value: num(7), forMs: 0 }, 'd.x != 7'],
  [
    's.mode == "eco" for 10m',
    { kind: 'compare', ref: s('mode'), op: '==', value: str('eco'), forMs: 600_000 },
    's.mode == "eco" for 10m',
  ],
  [
    "s.mode != 'eco' FOR 90s",
    { kind: 'compare', ref: s('mode'), op: '!=', value: str('eco'), forMs: 90_000 },
    's.mode != "eco" for 90s',
  ],
  [
    'meta.fwversion >= "2.0" for 1.5h',
    { kind: 'compare', ref: meta('fwversion'), op: '>=', value: str('2.0'), forMs: 5_400_000 },
    'meta.fwversion >= "2.0" for 90m',
  ],
  [
    'd.temp > 30 for 1500ms',
    { kind: 'compare', ref: d('temp'), op: '>', value: num(30), forMs: 1500 },
    'd.temp > 30 for 1500ms',
  ],
  [
    'd.temp > 30 for 1.1h',
    { kind: 'compare', ref: d('temp'), op: '>', value: num(30), forMs: 3_960_000 },
    'd.temp > 30 for 66m',
  ],
  [
    'd.temp > 30 for 7d',
    { kind: 'compare', ref: d('temp'), op: '>', value: num(30), forMs: FOR_MAX_MS },
    'd.temp > 30 for 7d',
  ],
  [
    'd.temp > 30 for 1s',
    { kind: 'compare', ref: d('temp'), op: '>', value: num(30), forMs: 1000 },
    'd.temp > 30 for 1s',
  ],
  [
    'd.temp > 30 for 2 H',
    { kind: 'compare', ref: d('temp'), op: '>', value: num(30), forMs: 7_200_000 },
    'd.temp > 30 for 2h',
  ],
  [
    '  d.a.b-c_1 \n <  "x"\tfor\n1d  ',
    { kind: 'compare', ref: d('a.b-c_1'), op: '<', value: str('x'), forMs: 86_400_000 },
    'd.a.b-c_1 < "x" for 1d',
  ],
  ['D.1wire == 1', { kind: 'compare', ref: d('1wire'), op: '==', value: num(1), forMs: 0 }, 'd.1wire == 1'],
  ['d.door became "open"', { kind: 'became', ref: d('door'), value: str('open'), forMs: 0 }, 'd.door became "open"'],
  [
    "d.door BECAME 'open' for 5m",
    { kind: 'became', ref: d('door'), value: str('open'), forMs: 300_000 },
    'd.door became "open" for 5m',
  ],
  ['d.count became 0', { kind: 'became', ref: d('count'), value: num(0), forMs: 0 }, 'd.count became 0'],
  ['meta.fwname changed', { kind: 'changed', ref: meta('fwname') }, 'meta.fwname changed'],
  ['s.setpoint Changed', { kind: 'changed', ref: s('setpoint') }, 's.setpoint changed'],
  ['offline', { kind: 'state', state: 'offline', forMs: 0 }, 'offline'],
  ['OFFLINE for 2m', { kind: 'state', state: 'offline', forMs: 120_000 }, 'offline for 2m'],
  ['online for 30s', { kind: 'state', state: 'online', forMs: 30_000 }, 'online for 30s'],
  ['online', { kind: 'state', state: 'online', forMs: 0 }, 'online'],
  ['firmware failed', { kind: 'firmware', outcome: 'failed' }, 'firmware failed'],
  ['Firmware Done', { kind: 'firmware', outcome: 'done' }, 'firmware done'],
  ['command failed', { kind: 'command', outcome: 'failed' }, 'command failed'],
  // Escapes, both quotes, and a string that holds the other quote.
  [
    String.raw`d.msg == "say \"hi\"\n\tand \\ \'"`,
    { kind: 'compare', ref: d('msg'), op: '==', value: str('say "hi"\n\tand \\ \''), forMs: 0 },
    String.raw`d.msg == "say \"hi\"\n\tand \\ '"`,
  ],
  [
    String.raw`d.msg == 'it\'s'`,
    { kind: 'compare', ref: d('msg'), op: '==', value: str("it's"), forMs: 0 },
    `d.msg == "it's"`,
  ],
  [`d.msg == ''`, { kind: 'compare', ref: d('msg'), op: '==', value: str(''), forMs: 0 }, 'd.msg == ""'],
  ['d.msg == "äö€😀"', { kind: 'compare', ref: d('msg'), op: '==', value: str('äö€😀'), forMs: 0 }, 'd.msg == "äö€😀"'],
  [
    `d.x == "${'a'.repeat(256)}"`,
    { kind: 'compare', ref: d('x'), op: '==', value: str('a'.repeat(256)), forMs: 0 },
    `d.x == "${'a'.repeat(256)}"`,
  ],
  [`d.${'n'.repeat(64)} changed`, { kind: 'changed', ref: d('n'.repeat(64)) }, `d.${'n'.repeat(64)} changed`],
];

describe('parseTrigger: every form', () => {
  it.each(VALID)('%s', (text, expected, canonical) => {
    expect(parseTrigger(text)).toEqual({ ok: true, trigger: expected });
    expect(formatTrigger(expected)).toBe(canonical);
    expect(parsed(formatTrigger(expected))).toEqual(expected);
  });
});

describe('formatTrigger round-trips', () => {
  const ASTS: Trigger[] = [
    ...VALID.map(([, t]) => t),
    ...[-0, 0.1, -1e-7, 1.5e-10, 1e21, -1e21, 123456.789, Number.MAX_VALUE, -Number.MIN_VALUE, 2 ** 53 + 2].map(
      (value): Trigger => ({ kind: 'compare', ref: d('x'), op: '<', value: num(value), forMs: 0 }),
    ),
    ...['"', "'", '\\', '\\"', '\n\t', "\\'\\", 'a"b\'c', '', ' '].map((value): Trigger => ({
      kind: 'became',
      ref: s('y'),
      value: str(value),
      forMs: 0,
    })),
    ...[1000, 1001, 59_999, 60_000, 61_000, 3_600_000, 86_400_000, 90_061_001, FOR_MAX_MS - 1, FOR_MAX_MS].map(
      (forMs): Trigger => ({ kind: 'state', state: 'offline', forMs }),
    ),
  ];
  it.each(ASTS.map((t) => [formatTrigger(t), t] as const))('%s', (text, t) => {
    // toEqual tells -0 from 0, so a negative zero keeps its sign too.
    expect(parsed(text)).toEqual(t);
  });
});

/** Bad inputs: the position of the error, and a piece of its message. */
const BAD: [string, number, string][] = [
  ['', 0, 'empty trigger'],
  ['   ', 0, 'empty trigger'],
  ['d.temp >', 8, 'expected a number or a quoted string after ">", found the end of the trigger'],
  ['d.temp > ', 9, 'found the end of the trigger'],
  ['x.temp > 1', 0, 'expected a variable (d.<name>, s.<name> or meta.<name>), found "x.temp"'],
  [
    'temp > 1',
    0,
    'expected a variable (d.<name>, s.<name> or meta.<name>), "offline", "online", "firmware" or "command", found "temp"',
  ],
  ['> 1', 0, 'found ">"'],
  ['"a" == d.x', 0, 'found "\\"a\\""'],
  ['d. > 1', 2, 'expected a variable name after d.'],
  ['d.-x > 1', 2, 'is not a variable name'],
  [`d.${'n'.repeat(65)} > 1`, 2, 'variable name longer than 64 characters'],
  ['d.temp => 3', 7, 'expected a comparison (<, <=, >, >=, ==, !=), "became" or "changed" after d.temp, found "=>"'],
  ['d.temp = 3', 7, 'found "="'],
  ['d.temp !== 3', 7, 'found "!=="'],
  ['d.temp', 6, 'after d.temp, found the end of the trigger'],
  ['d.temp is 3', 7, 'found "is"'],
  ['d.temp > abc', 9, 'expected a number or a quoted string after ">", found "abc"'],
  ['d.temp > 1e999', 9, 'number 1e999 is too large'],
  ['d.temp > - 1', 9, 'found "-"'],
  ['d.temp > .5', 9, 'found "."'],
  ['d.door became', 13, 'after "became"'],
  ['d.temp > 1 for 0s', 15, 'at least 1s'],
  ['d.temp > 1 for 999ms', 15, 'at least 1s'],
  ['d.temp > 1 for -5m', 15, 'at least 1s'],
  ['d.temp > 1 for 8d', 15, 'at most 7d'],
  ['offline for 8d', 12, 'at most 7d'],
  ['offline for 604800001ms', 12, 'at most 7d'],
  ['offline for 1.0005s', 12, 'not a whole number of milliseconds'],
  ['offline for 10', 14, 'expected a unit after 10 (ms, s, m, h or d), found the end of the trigger'],
  ['offline for 10min', 14, 'found "min"'],
  ['offline for', 11, 'expected a duration after "for"'],
  ['offline for m', 12, 'expected a duration after "for"'],
  ['offline for 1m for 2m', 15, 'unexpected "for" after the trigger; expected the end of the trigger'],
  ['d.temp > 1 2', 11, 'unexpected "2" after the trigger; expected "for" or the end of the trigger'],
  ['d.temp > 1 and d.x < 2', 11, 'unexpected "and" after the trigger'],
  ['d.temp > 1;', 10, 'unexpected ";"'],
  ['d.temp > 30m', 11, 'unexpected "m"'],
  ['offline now', 8, 'unexpected "now"'],
  ['d.temp > "abc', 9, 'unterminated string: no closing "'],
  ["d.temp > 'abc\\'", 9, "unterminated string: no closing '"],
  ['d.temp > "abc\\', 9, 'unterminated string'],
  ['d.temp > "a\\x"', 11, 'unknown escape "\\\\x" in a string'],
  ['d.temp > "a\\u0041"', 11, 'unknown escape'],
  ['d.temp > "a\nb"', 11, 'control character in a string'],
  [`d.x == "${'a'.repeat(257)}"`, 7, 'string longer than 256 characters'],
  [`d.x == "${'\\n'.repeat(200) + 'a'.repeat(57)}"`, 7, 'string longer than 256 characters'],
  ['d.x changed for 5m', 12, '"for" cannot follow "d.x changed"'],
  ['firmware failed for 5m', 16, '"for" cannot follow "firmware failed"'],
  ['command failed for 5m', 15, '"for" cannot follow "command failed"'],
  ['firmware', 8, 'expected "failed" or "done" after "firmware", found the end of the trigger'],
  ['firmware rolledback', 9, 'found "rolledback"'],
  ['command done', 8, 'expected "failed" after "command", found "done"'],
  ['offline.x', 0, 'expected a variable'],
  ['d.x changed changed', 12, 'unexpected "changed"'],
  ['d.x — 1', 4, 'found "—"'],
  ['😀', 0, 'found "😀"'],
  [`d.x == "${'a'.repeat(TRIGGER_MAX_LENGTH)}"`, TRIGGER_MAX_LENGTH, 'longer than 500 characters'],
  [' '.repeat(TRIGGER_MAX_LENGTH + 1), TRIGGER_MAX_LENGTH, 'longer than 500 characters'],
];

describe('parseTrigger: bad inputs', () => {
  it.each(BAD)('%j is an error at %i', (text, position, message) => {
    const result = parseTrigger(text);
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.error.position).toBe(position);
    expect(result.error.message).toContain(message);
  });

  it('a text of exactly the longest length parses', () => {
    const text = `d.x == "${'a'.repeat(256)}"`.padEnd(TRIGGER_MAX_LENGTH, ' ');
    expect(text.length).toBe(TRIGGER_MAX_LENGTH);
    expect(parseTrigger(text).ok).toBe(true);
  });

  it('gives the line and column of the error, both 1-based', () => {
    expect(parseTrigger('d.temp >\n  "abc')).toEqual({
      ok: false,
      error: { position: 11, line: 2, column: 3, message: 'unterminated string: no closing "' },
    });
    expect(parseTrigger('x')).toMatchObject({ ok: false, error: { position: 0, line: 1, column: 1 } });
    expect(parseTrigger('d.t > 1\n\nfor 0s')).toMatchObject({ ok: false, error: { position: 13, line: 3, column: 5 } });
  });
});

describe('holds', () => {
  const cases: [string, string | undefined, boolean][] = [
    // Numbers compare as numbers: "10" > "9" although "10" < "9" as text.
    ['d.t > 9', '10', true],
    ['d.t > 9', '9', false],
    ['d.t >= 9', '9', true],
    ['d.t < 9', ' 8.5 ', true],
    ['d.t < 9', '\n8\t', true],
    ['d.t == 30', '30.0', true],
    ['d.t == 30', '3e1', true],
    ['d.t == 30', '+30', true],
    ['d.t != 30', '31', true],
    ['d.t != 30', '30', false],
    ['d.t <= -2.5', '-2.5', true],
    ['d.t <= -2.5', '-2.4', false],
    ['d.t > 0', '.5', true],
    ['d.t > 0', '5.', true],
    // Not a number: no numeric comparison holds, not even `!=`.
    ['d.t != 30', 'abc', false],
    ['d.t < 30', '', false],
    ['d.t < 30', '   ', false],
    ['d.t < 30', '0x10', false],
    ['d.t > 1', '0b11', false],
    ['d.t > 1', '0o7', false],
    ['d.t > 1', 'Infinity', false],
    ['d.t < 1', '-Infinity', false],
    ['d.t < 1', 'NaN', false],
    ['d.t > 1', '1e999', false],
    ['d.t > 1', '12abc', false],
    ['d.t > 1', '1_000', false],
    // A missing value satisfies nothing.
    ['d.t > 1', undefined, false],
    ['d.t != 1', undefined, false],
    ['s.m != "eco"', undefined, false],
    ['d.t became 1', undefined, false],
    // Strings compare as text, by UTF-16 code units.
    ['s.m == "eco"', 'eco', true],
    ['s.m == "eco"', 'Eco', false],
    ['s.m == "eco"', ' eco', false],
    ['s.m != "eco"', 'comfort', true],
    ['s.m < "b"', 'a', true],
    ['s.m < "b"', 'B', true],
    ['s.m > "9"', '10', false],
    ['s.m >= "abc"', 'abc', true],
    ['s.m > "\uffff"', '😀', false],
    ['s.m == "10"', '10.0', false],
    ['s.m == ""', '', true],
    // became: equality, numeric for a number literal.
    ['d.door became "open"', 'open', true],
    ['d.door became "open"', 'opened', false],
    ['d.n became 1', '1.0', true],
    ['d.n became 1', 'one', false],
    ['d.n became "1"', '1.0', false],
    // State and firmware.
    ['offline', 'disconnected', true],
    ['offline', 'connected', false],
    ['offline', 'sleeping', false],
    ['offline', undefined, false],
    ['online', 'connected', true],
    ['online', 'disconnected', false],
    ['firmware failed', 'failed', true],
    ['firmware failed', 'rolledback', true],
    ['firmware failed', 'rollingback', false],
    ['firmware failed', 'done', false],
    ['firmware done', 'done', true],
    ['firmware done', 'idle', false],
    ['firmware done', undefined, false],
  ];
  it.each(cases)('%s with %j: %s', (text, value, expected) => {
    expect(holds(parsed(text), value)).toBe(expected);
  });

  it('is a bug on an edge trigger', () => {
    expect(() => holds(parsed('d.x changed'), 'a')).toThrow(/edge trigger/);
    expect(() => holds(parsed('command failed'), undefined)).toThrow(/edge trigger/);
  });
});

describe('watchedVar, isLevel, forMsOf', () => {
  const cases: [string, ReturnType<typeof watchedVar>, boolean, number][] = [
    ['d.t > 1 for 5s', d('t'), true, 5000],
    ['s.m became "x"', s('m'), true, 0],
    ['meta.fwname changed', meta('fwname'), false, 0],
    ['offline for 1m', meta('state'), true, 60_000],
    ['online', meta('state'), true, 0],
    ['firmware failed', meta('fwstate'), true, 0],
    ['command failed', undefined, false, 0],
  ];
  it.each(cases)('%s', (text, ref, level, forMs) => {
    const t = parsed(text);
    expect(watchedVar(t)).toEqual(ref);
    expect(isLevel(t)).toBe(level);
    expect(forMsOf(t)).toBe(forMs);
  });
});

describe('parseTrigger never throws', () => {
  const random = seededRandom;
  const ALPHABET = [
    ...'ds.meta<>=!-+0123456789eE. \t\n"\'\\xnfor msh()😀\u0000\ud800',
    'for',
    'became',
    'changed',
    'offline',
    'online',
    'firmware',
    'failed',
    'done',
    'command',
    'd.',
    '1e999',
    '1.5',
    '==',
    '\\"',
  ];

  function check(text: string): void {
    let result;
    try {
      result = parseTrigger(text);
    } catch (err) {
      throw new Error(`parseTrigger threw on ${JSON.stringify(text)}: ${String(err)}`);
    }
    if (result.ok) {
      // What parses formats to text that parses to the same trigger.
      expect(parseTrigger(formatTrigger(result.trigger)), JSON.stringify(text)).toEqual(result);
    } else {
      const { position, line, column } = result.error;
      expect(position >= 0 && position <= text.length, JSON.stringify(text)).toBe(true);
      const before = text.slice(0, position).split('\n');
      expect([line, column]).toEqual([before.length, before.at(-1)!.length + 1]);
    }
  }

  it('on random strings', () => {
    const rnd = random(17);
    for (let i = 0; i < 5000; i++) {
      const n = Math.floor(rnd() * 24);
      let text = '';
      for (let j = 0; j < n; j++) text += ALPHABET[Math.floor(rnd() * ALPHABET.length)]!;
      check(text);
    }
  });

  it('on random mutations of valid triggers', () => {
    const rnd = random(42);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;
    const seeds = VALID.map(([text]) => text);
    let parsedCount = 0;
    for (let i = 0; i < 5000; i++) {
      let text = pick(seeds);
      const edits = 1 + Math.floor(rnd() * 3);
      for (let e = 0; e < edits; e++) {
        const at = Math.floor(rnd() * (text.length + 1));
        switch (Math.floor(rnd() * 5)) {
          case 0: // delete one character
            text = text.slice(0, at) + text.slice(at + 1);
            break;
          case 1: // insert a piece
            text = text.slice(0, at) + pick(ALPHABET) + text.slice(at);
            break;
          case 2: // replace one character
            text = text.slice(0, at) + pick(ALPHABET) + text.slice(at + 1);
            break;
          case 3: // cut
            text = text.slice(0, at);
            break;
          default: // repeat a piece
            text = text.slice(0, at) + text.slice(Math.floor(rnd() * text.length)) + text.slice(at);
        }
      }
      check(text);
      if (parseTrigger(text).ok) parsedCount++;
    }
    // The mutations keep some triggers valid, so the round-trip check above ran on many inputs.
    expect(parsedCount).toBeGreaterThan(200);
  });
});
