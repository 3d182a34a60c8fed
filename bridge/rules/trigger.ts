/**
 * The trigger language of notification rules (docs/notifications.md#the-trigger-language): a condition on one
 * device's `d`, `s` or `meta` variable, or one of the events the bridge already knows (offline, online, firmware,
 * command). A hand-written lexer feeds a recursive-descent parser that builds a checked {@link Trigger}; nothing
 * is ever evaluated as code. Pure: no I/O, no clock.
 *
 * The lexer is pulled by the parser one token at a time, so the first error in the text is the one reported,
 * whether it is a lexical one (an unterminated string) or a grammatical one (a missing operator).
 */
import { VAR_NAME_RE } from '../../protocol/schemas.js';

export type VarType = 'd' | 's' | 'meta';
export interface VarRef {
  type: VarType;
  /** Matches `VAR_NAME_RE` (protocol/schemas.ts). */
  name: string;
}
export type Literal = { kind: 'number'; value: number } | { kind: 'string'; value: string };
export type CompareOp = '<' | '<=' | '>' | '>=' | '==' | '!=';
export type Trigger =
  /** Level: the variable compares with the literal, for at least `forMs`. */
  | { kind: 'compare'; ref: VarRef; op: CompareOp; value: Literal; forMs: number }
  /** Level: the variable equals the literal, for at least `forMs`. */
  | { kind: 'became'; ref: VarRef; value: Literal; forMs: number }
  /** Edge: every change of the variable's value. */
  | { kind: 'changed'; ref: VarRef }
  /** Level on `meta` `state`. */
  | { kind: 'state'; state: 'offline' | 'online'; forMs: number }
  /** Level on `meta` `fwstate`. */
  | { kind: 'firmware'; outcome: 'failed' | 'done' }
  /** Edge: a command of the device failed. */
  | { kind: 'command'; outcome: 'failed' };
export interface TriggerError {
  /** 0-based offset into the text, in UTF-16 code units. */
  position: number;
  /** 1-based. */
  line: number;
  /** 1-based, in UTF-16 code units. */
  column: number;
  message: string;
}
export type ParseResult = { ok: true; trigger: Trigger } | { ok: false; error: TriggerError };

/** The longest trigger text; a longer one is an error at this position. */
export const TRIGGER_MAX_LENGTH = 500;
/** The longest `for`: 7 days. */
export const FOR_MAX_MS = 7 * 24 * 3600 * 1000;
/** The shortest `for`: 1 second. */
export const FOR_MIN_MS = 1000;
/** The longest string literal, in UTF-16 code units once its escapes are read. */
export const STRING_MAX_LENGTH = 256;

const COMPARE_OPS: ReadonlySet<string> = new Set<CompareOp>(['<', '<=', '>', '>=', '==', '!=']);
const VAR_TYPES: ReadonlySet<string> = new Set<VarType>(['d', 's', 'meta']);
const UNIT_MS: Readonly<Record<string, number>> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
/** Largest first: {@link formatDuration} writes a duration in the largest unit that divides it. */
const UNITS_DESCENDING = ['d', 'h', 'm', 's', 'ms'] as const;
const ESCAPES: Readonly<Record<string, string>> = { '"': '"', "'": "'", '\\': '\\', n: '\n', t: '\t' };

// --- Lexer -----------------------------------------------------------------------------------------------------

type Token =
  /** A keyword or a variable reference: a letter, then letters, digits, `_`, `.` and `-`. */
  | { kind: 'word'; start: number; end: number; text: string }
  /** `text` is the lexeme, kept for the exact arithmetic of durations. */
  | { kind: 'number'; start: number; end: number; text: string; value: number }
  | { kind: 'string'; start: number; end: number; text: string; value: string }
  /** A run of `<`, `>`, `=` and `!`: one of the comparisons, or something that looks like one (`=>`). */
  | { kind: 'symbol'; start: number; end: number; text: string }
  /** Any other character. */
  | { kind: 'other'; start: number; end: number; text: string }
  | { kind: 'end'; start: number; end: number; text: '' };

class SyntaxFault extends Error {
  constructor(
    readonly position: number,
    message: string,
  ) {
    super(message);
  }
}

const isSpace = (c: string) => c === ' ' || c === '\t' || c === '\n' || c === '\r';
const isLetter = (c: string) => (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
const isDigit = (c: string) => c >= '0' && c <= '9';
const isWordChar = (c: string) => isLetter(c) || isDigit(c) || c === '_' || c === '.' || c === '-';
const isSymbol = (c: string) => c === '<' || c === '>' || c === '=' || c === '!';
const NUMBER_RE = /-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;

class Lexer {
  private pos = 0;
  private ahead: Token | undefined;

  constructor(private readonly text: string) {}

  peek(): Token {
    this.ahead ??= this.scan();
    return this.ahead;
  }

  next(): Token {
    const token = this.peek();
    this.ahead = undefined;
    return token;
  }

  private scan(): Token {
    const s = this.text;
    while (this.pos < s.length && isSpace(s[this.pos]!)) this.pos++;
    const start = this.pos;
    if (start >= s.length) return { kind: 'end', start, end: start, text: '' };
    const c = s[start]!;
    if (isLetter(c)) {
      let end = start + 1;
      while (end < s.length && isWordChar(s[end]!)) end++;
      this.pos = end;
      return { kind: 'word', start, end, text: s.slice(start, end) };
    }
    if (isDigit(c) || (c === '-' && isDigit(s[start + 1] ?? ''))) {
      NUMBER_RE.lastIndex = start;
      const text = NUMBER_RE.exec(s)![0];
      const end = start + text.length;
      const value = Number(text);
      if (!Number.isFinite(value)) throw new SyntaxFault(start, `number ${text} is too large`);
      this.pos = end;
      return { kind: 'number', start, end, text, value };
    }
    if (c === '"' || c === "'") return this.scanString(start, c);
    if (isSymbol(c)) {
      let end = start + 1;
      while (end < s.length && isSymbol(s[end]!)) end++;
      this.pos = end;
      return { kind: 'symbol', start, end, text: s.slice(start, end) };
    }
    // One code point, so that an error quotes a whole character rather than half a surrogate pair.
    const end = start + String.fromCodePoint(s.codePointAt(start)!).length;
    this.pos = end;
    return { kind: 'other', start, end, text: s.slice(start, end) };
  }

  private scanString(start: number, quote: string): Token {
    const s = this.text;
    let value = '';
    let i = start + 1;
    for (;;) {
      if (i >= s.length) throw new SyntaxFault(start, `unterminated string: no closing ${quote}`);
      const c = s[i]!;
      if (c === quote) break;
      if (c === '\\') {
        const e = s[i + 1];
        if (e === undefined) throw new SyntaxFault(start, `unterminated string: no closing ${quote}`);
        const decoded = ESCAPES[e];
        if (decoded === undefined) {
          throw new SyntaxFault(
            i,
            `unknown escape ${quoteText('\\' + e)} in a string; the escapes are \\" \\' \\\\ \\n \\t`,
          );
        }
        value += decoded;
        i += 2;
      } else if (c < ' ' || c === '\x7f') {
        throw new SyntaxFault(i, 'control character in a string; write a newline as \\n and a tab as \\t');
      } else {
        value += c;
        i++;
      }
    }
    if (value.length > STRING_MAX_LENGTH) {
      throw new SyntaxFault(start, `string longer than ${STRING_MAX_LENGTH} characters`);
    }
    this.pos = i + 1;
    return { kind: 'string', start, end: this.pos, text: s.slice(start, this.pos), value };
  }
}

/** A token as an error message shows it. */
function describe(token: Token): string {
  if (token.kind === 'end') return 'the end of the trigger';
  const text = token.text.length > 40 ? token.text.slice(0, 40) + '…' : token.text;
  return quoteText(text);
}

function quoteText(text: string): string {
  return JSON.stringify(text);
}

// --- Parser ----------------------------------------------------------------------------------------------------
//
// trigger   = ref ( op literal [ for ] | "became" literal [ for ] | "changed" )
//           | ( "offline" | "online" ) [ for ]
//           | "firmware" ( "failed" | "done" )
//           | "command" "failed" ;
// for       = "for" duration ;
//
// docs/notifications.md has the whole grammar, with the tokens.

class Parser {
  private readonly lex: Lexer;

  constructor(text: string) {
    this.lex = new Lexer(text);
  }

  trigger(): Trigger {
    const first = this.lex.peek();
    const keyword = first.kind === 'word' ? first.text.toLowerCase() : undefined;
    let trigger: Trigger;
    if (keyword === 'offline' || keyword === 'online') {
      this.lex.next();
      trigger = { kind: 'state', state: keyword, forMs: this.optionalFor() };
    } else if (keyword === 'firmware') {
      this.lex.next();
      const outcome = this.keyword(['failed', 'done'], '"firmware"');
      trigger = { kind: 'firmware', outcome };
      this.noFor('"firmware ' + outcome + '"');
    } else if (keyword === 'command') {
      this.lex.next();
      trigger = { kind: 'command', outcome: this.keyword(['failed'], '"command"') };
      this.noFor('"command failed"');
    } else if (first.kind === 'word' && first.text.includes('.')) {
      trigger = this.condition();
    } else {
      throw new SyntaxFault(
        first.start,
        `expected a variable (d.<name>, s.<name> or meta.<name>), "offline", "online", "firmware" or "command", found ${describe(first)}`,
      );
    }
    const rest = this.lex.next();
    if (rest.kind !== 'end') {
      const allowsFor = trigger.kind === 'compare' || trigger.kind === 'became' || trigger.kind === 'state';
      const expected =
        allowsFor && forMsOf(trigger) === 0 ? '"for" or the end of the trigger' : 'the end of the trigger';
      throw new SyntaxFault(rest.start, `unexpected ${describe(rest)} after the trigger; expected ${expected}`);
    }
    return trigger;
  }

  /** `ref ( op literal [ for ] | "became" literal [ for ] | "changed" )`. */
  private condition(): Trigger {
    const ref = this.ref();
    const refText = formatRef(ref);
    const token = this.lex.next();
    if (token.kind === 'symbol' && COMPARE_OPS.has(token.text)) {
      const op = token.text as CompareOp;
      const value = this.literal(`"${op}"`);
      return { kind: 'compare', ref, op, value, forMs: this.optionalFor() };
    }
    const keyword = token.kind === 'word' ? token.text.toLowerCase() : undefined;
    if (keyword === 'became') {
      const value = this.literal('"became"');
      return { kind: 'became', ref, value, forMs: this.optionalFor() };
    }
    if (keyword === 'changed') {
      this.noFor(`"${refText} changed"`);
      return { kind: 'changed', ref };
    }
    throw new SyntaxFault(
      token.start,
      `expected a comparison (<, <=, >, >=, ==, !=), "became" or "changed" after ${refText}, found ${describe(token)}`,
    );
  }

  /** `( "d" | "s" | "meta" ) "." name`, one word token. */
  private ref(): VarRef {
    const token = this.lex.next();
    if (token.kind !== 'word') throw new Error('ref() called on a token that is not a word');
    const dot = token.text.indexOf('.');
    const type = token.text.slice(0, dot).toLowerCase();
    if (!VAR_TYPES.has(type)) {
      throw new SyntaxFault(
        token.start,
        `expected a variable (d.<name>, s.<name> or meta.<name>), found ${describe(token)}: the type is d, s or meta`,
      );
    }
    const name = token.text.slice(dot + 1);
    const at = token.start + dot + 1;
    if (name === '') throw new SyntaxFault(at, `expected a variable name after ${type}.`);
    if (name.length > 64) throw new SyntaxFault(at, 'variable name longer than 64 characters');
    if (!VAR_NAME_RE.test(name)) {
      throw new SyntaxFault(
        at,
        `${quoteText(name)} is not a variable name: it starts with a letter or a digit, then letters, digits, _, . and -`,
      );
    }
    return { type: type as VarType, name };
  }

  /** `number | string`. */
  private literal(after: string): Literal {
    const token = this.lex.next();
    if (token.kind === 'number') return { kind: 'number', value: token.value };
    if (token.kind === 'string') return { kind: 'string', value: token.value };
    throw new SyntaxFault(token.start, `expected a number or a quoted string after ${after}, found ${describe(token)}`);
  }

  /** One of the given keywords, lower-cased. */
  private keyword<K extends string>(words: readonly K[], after: string): K {
    const token = this.lex.next();
    const word = token.kind === 'word' ? token.text.toLowerCase() : undefined;
    const found = words.find((w) => w === word);
    if (found !== undefined) return found;
    const expected = words.map((w) => `"${w}"`).join(' or ');
    throw new SyntaxFault(token.start, `expected ${expected} after ${after}, found ${describe(token)}`);
  }

  private isFor(token: Token): boolean {
    return token.kind === 'word' && token.text.toLowerCase() === 'for';
  }

  /** `[ "for" duration ]`: 0 without one. */
  private optionalFor(): number {
    if (!this.isFor(this.lex.peek())) return 0;
    this.lex.next();
    return this.duration();
  }

  /** A trigger that fires on an event, or on a state that has no duration, refuses `for` with a message. */
  private noFor(what: string): void {
    const token = this.lex.peek();
    if (this.isFor(token)) {
      throw new SyntaxFault(
        token.start,
        `"for" cannot follow ${what}: only a comparison, "became", "offline" and "online" take a duration`,
      );
    }
  }

  /** `number unit`, at least {@link FOR_MIN_MS} and at most {@link FOR_MAX_MS}, in whole milliseconds. */
  private duration(): number {
    const token = this.lex.next();
    if (token.kind !== 'number') {
      throw new SyntaxFault(
        token.start,
        `expected a duration after "for" (such as 30s, 10m or 2h), found ${describe(token)}`,
      );
    }
    const unitToken = this.lex.next();
    const unit = unitToken.kind === 'word' ? unitToken.text.toLowerCase() : undefined;
    const factor = unit === undefined ? undefined : UNIT_MS[unit];
    if (factor === undefined) {
      throw new SyntaxFault(
        unitToken.start,
        `expected a unit after ${token.text} (ms, s, m, h or d), found ${describe(unitToken)}`,
      );
    }
    const approx = token.value * factor;
    if (approx < FOR_MIN_MS) throw new SyntaxFault(token.start, 'a duration after "for" is at least 1s');
    if (approx > FOR_MAX_MS) throw new SyntaxFault(token.start, 'a duration after "for" is at most 7d');
    const ms = exactMs(token.text, factor);
    if (ms === undefined)
      throw new SyntaxFault(token.start, `${token.text}${unit} is not a whole number of milliseconds`);
    return ms;
  }
}

/**
 * The milliseconds of a non-negative decimal lexeme times a unit, exactly (1.1h is 3960000, where floating point
 * says 3960000.0000000005), or undefined when that is not a whole number. The caller has bounded the value, which
 * bounds the exponent, so the powers of ten stay small.
 */
function exactMs(lexeme: string, factor: number): number | undefined {
  const m = /^([0-9]+)(?:\.([0-9]+))?(?:[eE]([+-]?[0-9]+))?$/.exec(lexeme);
  if (m === null) return undefined;
  const fraction = m[2] ?? '';
  const scale = Number(m[3] ?? '0') - fraction.length;
  const scaled = BigInt(m[1]! + fraction) * BigInt(factor);
  if (scale >= 0) return Number(scaled * 10n ** BigInt(scale));
  const divisor = 10n ** BigInt(-scale);
  return scaled % divisor === 0n ? Number(scaled / divisor) : undefined;
}

function lineAndColumn(text: string, position: number): { line: number; column: number } {
  let line = 1;
  let lineStart = 0;
  for (let i = 0; i < position && i < text.length; i++) {
    if (text[i] === '\n') {
      line++;
      lineStart = i + 1;
    }
  }
  return { line, column: position - lineStart + 1 };
}

function failure(text: string, position: number, message: string): ParseResult {
  return { ok: false, error: { position, ...lineAndColumn(text, position), message } };
}

/** Parses a trigger; never throws on any input (docs/notifications.md#the-trigger-language). */
export function parseTrigger(text: string): ParseResult {
  if (text.length > TRIGGER_MAX_LENGTH) {
    return failure(text, TRIGGER_MAX_LENGTH, `trigger longer than ${TRIGGER_MAX_LENGTH} characters`);
  }
  if (text.trim() === '') {
    return failure(text, 0, 'empty trigger; expected a condition such as d.temp > 30, or offline, firmware failed…');
  }
  try {
    return { ok: true, trigger: new Parser(text).trigger() };
  } catch (err) {
    if (err instanceof SyntaxFault) return failure(text, err.position, err.message);
    throw err;
  }
}

// --- Formatting and reading ------------------------------------------------------------------------------------

function formatRef(ref: VarRef): string {
  return `${ref.type}.${ref.name}`;
}

function formatLiteral(literal: Literal): string {
  if (literal.kind === 'number') return Object.is(literal.value, -0) ? '-0' : String(literal.value);
  const escaped = literal.value.replace(/[\\"\n\t]/g, (c) => (c === '\n' ? '\\n' : c === '\t' ? '\\t' : '\\' + c));
  return `"${escaped}"`;
}

function formatDuration(ms: number): string {
  const unit = UNITS_DESCENDING.find((u) => ms % UNIT_MS[u]! === 0) ?? 'ms';
  return `${ms / UNIT_MS[unit]!}${unit}`;
}

function withFor(text: string, forMs: number): string {
  return forMs > 0 ? `${text} for ${formatDuration(forMs)}` : text;
}

/** The canonical text of a parsed trigger: `parseTrigger(formatTrigger(t))` gives `t` back. */
export function formatTrigger(t: Trigger): string {
  switch (t.kind) {
    case 'compare':
      return withFor(`${formatRef(t.ref)} ${t.op} ${formatLiteral(t.value)}`, t.forMs);
    case 'became':
      return withFor(`${formatRef(t.ref)} became ${formatLiteral(t.value)}`, t.forMs);
    case 'changed':
      return `${formatRef(t.ref)} changed`;
    case 'state':
      return withFor(t.state, t.forMs);
    case 'firmware':
      return `firmware ${t.outcome}`;
    case 'command':
      return `command ${t.outcome}`;
  }
}

/** The variable a trigger watches: its own, `meta.state`, `meta.fwstate`, or none for a command. */
export function watchedVar(t: Trigger): VarRef | undefined {
  switch (t.kind) {
    case 'compare':
    case 'became':
    case 'changed':
      return t.ref;
    case 'state':
      return { type: 'meta', name: 'state' };
    case 'firmware':
      return { type: 'meta', name: 'fwstate' };
    case 'command':
      return undefined;
  }
}

/** Level triggers hold or not for a value (and fire on becoming true); edge triggers fire on an event. */
export function isLevel(t: Trigger): boolean {
  switch (t.kind) {
    case 'compare':
    case 'became':
    case 'state':
    case 'firmware':
      return true;
    case 'changed':
    case 'command':
      return false;
  }
}

/** How long a level trigger's condition must hold before it fires; 0 when at once. */
export function forMsOf(t: Trigger): number {
  return t.kind === 'compare' || t.kind === 'became' || t.kind === 'state' ? t.forMs : 0;
}

/** Decimal only: JS `Number` would also take hex, octal, binary and `Infinity`, which a value does not mean. */
const DECIMAL_RE = /^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$/;

/** A variable's value as a number, or undefined when it is not a finite decimal number. */
export function numericValue(value: string): number | undefined {
  const trimmed = value.trim();
  if (!DECIMAL_RE.test(trimmed)) return undefined;
  const n = Number(trimmed);
  return Number.isFinite(n) ? n : undefined;
}

function compare<T extends number | string>(a: T, op: CompareOp, b: T): boolean {
  switch (op) {
    case '<':
      return a < b;
    case '<=':
      return a <= b;
    case '>':
      return a > b;
    case '>=':
      return a >= b;
    case '==':
      return a === b;
    case '!=':
      return a !== b;
  }
}

/** Whether a level trigger's condition holds for the variable's current value (undefined: missing or deleted). */
export function holds(t: Trigger, value: string | undefined): boolean {
  switch (t.kind) {
    case 'compare':
    case 'became': {
      // A missing variable satisfies no condition, not even `!=`.
      if (value === undefined) return false;
      const op = t.kind === 'compare' ? t.op : '==';
      if (t.value.kind === 'string') return compare(value, op, t.value.value);
      const n = numericValue(value);
      return n !== undefined && compare(n, op, t.value.value);
    }
    case 'state':
      return value === (t.state === 'offline' ? 'disconnected' : 'connected');
    case 'firmware':
      return t.outcome === 'failed' ? value === 'failed' || value === 'rolledback' : value === 'done';
    case 'changed':
    case 'command':
      throw new Error(`holds() on the edge trigger ${formatTrigger(t)}`);
  }
}
