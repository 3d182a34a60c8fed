/**
 * The flash benchmark's readings (bench/support/flash.ts): `/proc/<pid>/io` and a block device's `stat` parsed
 * into bytes, and a missing field refused rather than read as 0.
 */
import { describe, expect, it } from 'vitest';
import { parseBlockStatWritten, parseProcIo, readIo } from '../../bench/support/flash.js';

const PROC_IO = `rchar: 3298765
wchar: 1048999
syscr: 412
syscw: 260
read_bytes: 8192
write_bytes: 1052672
cancelled_write_bytes: 4096
`;

describe('flash readings', () => {
  it('parses /proc/<pid>/io into bytes', () => {
    expect(parseProcIo(PROC_IO)).toEqual({
      rchar: 3298765,
      wchar: 1048999,
      readBytes: 8192,
      writeBytes: 1052672,
      cancelledWriteBytes: 4096,
    });
  });

  it('refuses a /proc/<pid>/io without write_bytes (no task I/O accounting)', () => {
    const without = PROC_IO.replace(/^write_bytes:.*\n/m, '');
    expect(() => parseProcIo(without)).toThrow(/no write_bytes/);
  });

  it("reads this process's own counters", () => {
    const io = readIo('self');
    expect(io.rchar).toBeGreaterThan(0);
    expect(Number.isInteger(io.writeBytes)).toBe(true);
  });

  it("takes the sectors written from a block device's stat, in bytes", () => {
    // reads, merged, sectors read, ms, writes, merged, sectors written, ms, in flight, ...
    const line = '     55        0     2102        2      180        3    40960       75        0      120       77\n';
    expect(parseBlockStatWritten(line)).toBe(40960 * 512);
    expect(() => parseBlockStatWritten('12 0 3')).toThrow(/not a block device stat line/);
  });
});
