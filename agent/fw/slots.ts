/**
 * The built-in A/B slot installer (docs/decisions.md §7). A slots directory holds two slot folders, `a` and `b`, and
 * a symlink `current` naming the active one. An image is always unpacked into the inactive slot, so a failed or
 * interrupted install never touches what is running; switching is one atomic rename of the `current` link.
 *
 *   D/a/        slot contents
 *   D/b/        slot contents
 *   D/current   -> a | b   (missing means `a`)
 *   D/previous  -> a | b   (the slot that was active before the last switch; what a rollback returns to)
 */
import { randomBytes } from 'node:crypto';
import { chmod, lstat, mkdir, readFile, readdir, readlink, rename, rm, stat, symlink, unlink } from 'node:fs/promises';
import { isAbsolute, join, normalize, posix, resolve, sep } from 'node:path';
import { fsyncPath } from '../../lib/fsutil.js';
import { type OutputBound, type RunEnded, type RunInGroup, runInGroup } from '../../lib/process.js';
import { z } from 'zod';

export type SlotName = 'a' | 'b';

export type InstallErrorCode =
  | 'bad-layout'
  | 'bad-archive'
  | 'bad-member'
  | 'too-large'
  | 'unpack-failed'
  | 'bad-manifest'
  | 'script-failed'
  | 'script-timeout'
  | 'io';

/** One error class with a stable code, so the firmware job can report `fwerror` without reading message text. */
export class InstallError extends Error {
  override name = 'InstallError';
  constructor(
    readonly code: InstallErrorCode,
    message: string,
  ) {
    super(message);
  }
}

export function isInstallError(err: unknown): err is InstallError {
  return err instanceof InstallError;
}

/** A relative path that stays inside the folder it is resolved against. */
function isContainedPath(p: string): boolean {
  if (p === '' || isAbsolute(p)) return false;
  return !p.split(/[\\/]+/).includes('..');
}

export const ImageManifest = z.object({
  name: z.string().min(1),
  version: z.union([z.string().min(1), z.number()]),
  install: z
    .string()
    .min(1)
    .refine(isContainedPath, { message: 'must be a relative path inside the image' })
    .optional(),
});
export type ImageManifest = z.infer<typeof ImageManifest>;

export interface InstallOptions {
  /** How long the image's install script may run, in milliseconds, before it is killed. Default 5 minutes. */
  scriptTimeoutMs?: number;
  /** How long each `tar` run may take, in milliseconds. Default 10 minutes. */
  tarTimeoutMs?: number;
  /** Extra environment for the install script, on top of the agent's own. */
  env?: Record<string, string>;
  /** The most bytes the image may unpack to (the sum of its members' sizes). Default 4 GiB. */
  maxBytes?: number;
  /** The most members (files, folders, links) the image may hold. Default 100,000. */
  maxFiles?: number;
  /** The image's `tar -tv` listing, when it was made beforehand (`listInBackground`). */
  listing?: string;
  /** What runs `tar` and the install script; `runInGroup` when not given (a test may give another). */
  run?: RunInGroup;
}

export interface InstallResult {
  slot: SlotName;
  manifest: ImageManifest;
}

const DEFAULT_SCRIPT_TIMEOUT_MS = 5 * 60_000;
const DEFAULT_TAR_TIMEOUT_MS = 10 * 60_000;
const DEFAULT_MAX_BYTES = 4 * 1024 ** 3;
const DEFAULT_MAX_FILES = 100_000;
/** Only the tail of a failing process's output goes into the error; the job error must stay short. */
const OUTPUT_TAIL = 2000;

export function otherSlot(slot: SlotName): SlotName {
  return slot === 'a' ? 'b' : 'a';
}

function isSlotName(s: string): s is SlotName {
  return s === 'a' || s === 'b';
}

function errnoCode(err: unknown): string | undefined {
  return err instanceof Error && 'code' in err ? String((err as NodeJS.ErrnoException).code) : undefined;
}

async function readSlotLink(dir: string, link: string): Promise<SlotName | undefined> {
  let target: string;
  try {
    target = await readlink(join(dir, link));
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw new InstallError('bad-layout', `cannot read ${join(dir, link)}: ${String(err)}`);
  }
  if (!isSlotName(target)) {
    throw new InstallError('bad-layout', `${join(dir, link)} points at "${target}", expected "a" or "b"`);
  }
  return target;
}

/** The active slot: the target of `current`, or `a` when no switch has happened yet. */
export async function activeSlot(dir: string): Promise<SlotName> {
  return (await readSlotLink(dir, 'current')) ?? 'a';
}

export async function inactiveSlot(dir: string): Promise<SlotName> {
  return otherSlot(await activeSlot(dir));
}

/** Creates the slots directory and both slot folders if they are missing; never removes anything. */
export async function ensureSlots(dir: string): Promise<void> {
  await mkdir(join(dir, 'a'), { recursive: true });
  await mkdir(join(dir, 'b'), { recursive: true });
}

/** Replaces the symlink `dir/link` with one to `target` by a rename, so a reader sees the old or the new link. */
async function replaceLink(dir: string, link: string, target: SlotName): Promise<void> {
  const tmp = join(dir, `${link}.tmp-${randomBytes(6).toString('hex')}`);
  await symlink(target, tmp);
  try {
    await rename(tmp, join(dir, link));
  } catch (err) {
    await unlink(tmp).catch(() => undefined);
    throw err;
  }
  await fsyncPath(dir);
}

/**
 * Makes `slot` the active slot. Remembers the slot it replaces, for `rollbackSlot`. Switching to the slot that
 * is already active changes nothing but makes sure `current` exists.
 */
export async function switchSlot(dir: string, slot: SlotName): Promise<void> {
  await ensureSlots(dir);
  const active = await activeSlot(dir);
  // `previous` is written first: a crash between the two renames leaves both naming the old slot, which is safe.
  if (active !== slot) await replaceLink(dir, 'previous', active);
  await replaceLink(dir, 'current', slot);
}

/**
 * Points `current` back at the slot that was active before the last switch, and returns the slot now active.
 * Repeating it changes nothing; with no switch recorded there is nothing to return to and the active slot stays.
 */
export async function rollbackSlot(dir: string): Promise<SlotName> {
  await ensureSlots(dir);
  const previous = await readSlotLink(dir, 'previous');
  if (previous === undefined) return activeSlot(dir);
  await replaceLink(dir, 'current', previous);
  return previous;
}

/**
 * Points `current` at `slot` without touching `previous`: the rollback of an update, which returns to the slot
 * recorded before it was installed (whatever `previous` says). Repeating it changes nothing.
 */
export async function restoreSlot(dir: string, slot: SlotName): Promise<void> {
  await ensureSlots(dir);
  await replaceLink(dir, 'current', slot);
}

/** What the installers keep of a program's stderr: its end, for the job error (which must stay short). */
export const PROGRAM_STDERR: OutputBound = { maxBytes: OUTPUT_TAIL, keep: 'tail' };

/** How a program ended, for an error: its exit status or signal, then the end of its stderr. */
export function describeExit(r: RunEnded): string {
  const how = r.code !== null ? `exit status ${r.code}` : `signal ${r.signal ?? 'unknown'}`;
  const err = r.stderr.text.trim();
  return err === '' ? how : `${how}: ${err}`;
}

/** Runs `tar` (in its own process group: runInGroup) and resolves to its stdout, all of it. */
async function runTar(args: string[], timeoutMs: number, what: string, run: RunInGroup): Promise<string> {
  const r = await run({
    file: 'tar',
    args,
    env: { ...process.env, LC_ALL: 'C' },
    stdout: { maxBytes: Infinity, keep: 'head' },
    stderr: PROGRAM_STDERR,
    timeoutMs,
  });
  if (r.kind === 'spawn-error') {
    throw new InstallError('unpack-failed', `cannot run tar to ${what}: ${String(r.error)}`);
  }
  if (r.timedOut)
    throw new InstallError('unpack-failed', `tar timed out after ${timeoutMs} ms while trying to ${what}`);
  if (r.code !== 0) throw new InstallError('unpack-failed', `tar failed to ${what} (${describeExit(r)})`);
  return r.stdout.text;
}

/** One member of a `tar -tv` listing: `mode owner size date time name[ -> target | link to target]`. */
interface Member {
  type: string;
  size: number;
  name: string;
  /** The target of a symbolic (`l`) or hard (`h`) link. */
  target?: string;
}

/** Parses a `tar -tv` line; GNU and BusyBox tar print the same columns. `undefined` for a line it cannot read. */
function parseMember(line: string): Member | undefined {
  const m = /^(\S+)\s+\S+\s+(\S+)\s+\S+\s+\S+\s(.*)$/.exec(line);
  if (!m) return undefined;
  let type = m[1]![0]!;
  const rest = m[3]!;
  const size = Number(m[2]);
  // BusyBox lists a hard link as a plain file followed by ` -> target`; it is read as the hard link it is.
  if (type === '-' && rest.includes(' -> ')) type = 'h';
  if (type === 'l' || type === 'h') {
    const arrow = type === 'l' || !rest.includes(' link to ') ? ' -> ' : ' link to ';
    const at = rest.indexOf(arrow);
    // A second arrow makes the split ambiguous; such an image is refused rather than guessed at.
    if (at < 0 || rest.indexOf(arrow, at + 1) >= 0) return undefined;
    return { type, size: 0, name: rest.slice(0, at), target: rest.slice(at + arrow.length) };
  }
  return { type, size: Number.isFinite(size) ? size : 0, name: rest };
}

/** What a `tar -tv` type letter is, for the message that refuses it. */
const MEMBER_KINDS: Record<string, string> = {
  c: 'a character device',
  b: 'a block device',
  p: 'a FIFO',
  s: 'a socket',
};

/** A member's name as the image's root sees it: `./bin/app/` and `bin/app` are the same member. */
function memberKey(name: string): string {
  return posix.normalize(name.replace(/\/+$/, '') || '.').replace(/^(\.\/)+/, '');
}

/**
 * Refuses an archive before anything is written, from its `tar -tv` listing, if a member could land outside the
 * slot (an absolute name, a `..` segment, a link whose target leaves the image), if a member is anything but a
 * regular file, a folder, a symbolic link inside the image or a hard link to a file of the image (device nodes,
 * FIFOs, sockets: docs/firmware.md, the image format), or if it would unpack to more than `limits` allow (a small
 * compressed image can hold a huge or countless files).
 */
function checkMembers(listing: string, limits: { maxBytes: number; maxFiles: number }): void {
  const lines = listing.split('\n').filter((l) => l !== '');
  if (lines.length > limits.maxFiles) {
    throw new InstallError('too-large', `the image holds ${lines.length} members, more than ${limits.maxFiles}`);
  }
  let bytes = 0;
  /** The regular files listed so far: what a hard link may name. */
  const files = new Set<string>();
  for (const line of lines) {
    // The type is read first: a device node's size column (`1,3`) is not a size, and its kind is the answer.
    const kind = MEMBER_KINDS[line[0] ?? ''];
    if (kind !== undefined) {
      const name = /\s\d\d:\d\d(?::\d\d)?\s(.*)$/.exec(line)?.[1] ?? line;
      throw new InstallError(
        'bad-member',
        `the image has ${kind}, "${name}": only files, folders and links are allowed`,
      );
    }
    const member = parseMember(line);
    if (!member) throw new InstallError('bad-archive', `the image has a member that cannot be checked: ${line}`);
    if (!['-', 'd', 'l', 'h'].includes(member.type)) {
      throw new InstallError('bad-member', `the image has a member of type "${member.type}": ${line}`);
    }
    if (!isContainedPath(member.name.replace(/\/+$/, '') || '.')) {
      throw new InstallError('bad-archive', `the image has a member outside its root: "${member.name}"`);
    }
    bytes += member.size;
    if (bytes > limits.maxBytes) {
      throw new InstallError('too-large', `the image unpacks to more than ${limits.maxBytes} bytes`);
    }
    if (member.type === '-') files.add(memberKey(member.name));
    if (member.target === undefined) continue;
    // A symbolic link's target is relative to the folder the link is in (`bin/sh -> ../busybox` stays inside);
    // a hard link's names another member, from the image's root.
    const { name, target } = member;
    const resolved =
      member.type === 'l' && !isAbsolute(target) ? posix.normalize(posix.join(posix.dirname(name), target)) : target;
    if (target === '' || !isContainedPath(resolved) || resolved === '..' || resolved.startsWith('../')) {
      throw new InstallError('bad-archive', `the image has a link that leaves its root: ${line}`);
    }
    // A hard link shares its target's inode: it may only name a regular file the image itself holds.
    if (member.type === 'h' && !files.has(memberKey(target))) {
      throw new InstallError('bad-member', `the image has a hard link to something that is not a file of it: ${line}`);
    }
  }
}

/**
 * After unpacking, looks at what actually landed in the slot (the listing is tar's text; this is the file system):
 * anything but a regular file, a folder or a symbolic link, or a file with a hard link outside the slot, refuses
 * the image. Then strips setuid, setgid and sticky bits, so an image cannot install a program that runs with its
 * owner's rights (the owner is the agent's user already: `--no-same-owner`). docs/firmware.md, the image format.
 */
async function checkUnpacked(slotDir: string): Promise<void> {
  const entries: { path: string; mode: number }[] = [];
  const links = new Map<string, { path: string; nlink: number; seen: number }>();
  const walk = async (dir: string, rel: string): Promise<void> => {
    for (const name of await readdir(dir)) {
      const path = join(dir, name);
      const relPath = rel === '' ? name : `${rel}/${name}`;
      const st = await lstat(path);
      if (st.isSymbolicLink()) continue;
      if (st.isDirectory()) {
        entries.push({ path, mode: st.mode });
        await walk(path, relPath);
      } else if (st.isFile()) {
        entries.push({ path, mode: st.mode });
        if (st.nlink > 1) {
          const key = `${st.dev}:${st.ino}`;
          const l = links.get(key) ?? { path: relPath, nlink: st.nlink, seen: 0 };
          l.seen++;
          links.set(key, l);
        }
      } else {
        const kind = st.isCharacterDevice()
          ? 'a character device'
          : st.isBlockDevice()
            ? 'a block device'
            : st.isFIFO()
              ? 'a FIFO'
              : st.isSocket()
                ? 'a socket'
                : 'a special file';
        throw new InstallError(
          'bad-member',
          `the image has ${kind}, "${relPath}": only files, folders and links are allowed`,
        );
      }
    }
  };
  try {
    const root = await lstat(slotDir);
    entries.push({ path: slotDir, mode: root.mode });
    await walk(slotDir, '');
  } catch (err) {
    if (isInstallError(err)) throw err;
    throw new InstallError('io', `cannot check what was unpacked into ${slotDir}: ${String(err)}`);
  }
  for (const l of links.values()) {
    if (l.seen < l.nlink) {
      throw new InstallError('bad-member', `the image has a hard link to a file outside it: "${l.path}"`);
    }
  }
  try {
    for (const e of entries) if ((e.mode & 0o7000) !== 0) await chmod(e.path, e.mode & 0o777);
  } catch (err) {
    throw new InstallError('io', `cannot clear setuid, setgid and sticky bits in ${slotDir}: ${String(err)}`);
  }
}

/**
 * Lists an image's members (`tar -tv`) in the background, so that the listing the installer checks can be made
 * while something else runs (the updater starts it beside the verification). `finish` waits for it.
 */
export interface BackgroundListing {
  finish(): Promise<string>;
  abort(): void;
}

export function listInBackground(
  imagePath: string,
  opts: { timeoutMs?: number; run?: RunInGroup } = {},
): BackgroundListing {
  const stop = new AbortController();
  const timeoutMs = opts.timeoutMs ?? DEFAULT_TAR_TIMEOUT_MS;
  // Started now; in its own process group (runInGroup), killed with SIGKILL at the timeout or by `abort`.
  const done = (opts.run ?? runInGroup)({
    file: 'tar',
    args: ['-tvzf', imagePath],
    env: { ...process.env, LC_ALL: 'C' },
    stdout: { maxBytes: Infinity, keep: 'head' },
    stderr: PROGRAM_STDERR,
    timeoutMs,
    signal: stop.signal,
  });
  return {
    async finish() {
      const r = await done;
      if (r.kind === 'spawn-error') {
        throw new InstallError('unpack-failed', `cannot run tar to list the image: ${r.error.message}`);
      }
      if (r.code !== 0) {
        const why = r.stderr.text.trim();
        throw new InstallError(
          'unpack-failed',
          `tar failed to list the image (exit status ${r.code}${why ? `: ${why}` : ''})`,
        );
      }
      return r.stdout.text;
    },
    abort: () => stop.abort(),
  };
}

async function readManifest(slotDir: string): Promise<ImageManifest> {
  let text: string;
  try {
    text = await readFile(join(slotDir, 'manifest.json'), 'utf8');
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') throw new InstallError('bad-manifest', 'the image has no manifest.json');
    throw new InstallError('bad-manifest', `cannot read the image's manifest.json: ${String(err)}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new InstallError('bad-manifest', `the image's manifest.json is not valid JSON: ${(err as Error).message}`);
  }
  const parsed = ImageManifest.safeParse(json);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ');
    throw new InstallError('bad-manifest', `the image's manifest.json is invalid: ${issues}`);
  }
  return parsed.data;
}

async function runInstallScript(
  slotDir: string,
  script: string,
  opts: { timeoutMs: number; env: Record<string, string>; run: RunInGroup },
): Promise<void> {
  const path = join(slotDir, normalize(script));
  if (!path.startsWith(slotDir + sep)) {
    throw new InstallError('bad-manifest', `the install script "${script}" is outside the image`);
  }
  try {
    if (!(await stat(path)).isFile()) throw new Error('not a file');
  } catch {
    throw new InstallError('bad-manifest', `the install script "${script}" named by manifest.json is not in the image`);
  }
  // In its own process group (runInGroup): the timeout kills what the script started too. Its stdout is discarded.
  const r = await opts.run({
    file: path,
    cwd: slotDir,
    env: { ...process.env, ...opts.env, DEVCLOUD_SLOT: slotDir },
    stderr: PROGRAM_STDERR,
    timeoutMs: opts.timeoutMs,
  });
  if (r.kind === 'spawn-error') {
    throw new InstallError('script-failed', `cannot start the install script "${script}": ${String(r.error)}`);
  }
  if (r.timedOut) {
    throw new InstallError(
      'script-timeout',
      `the install script "${script}" ran longer than ${opts.timeoutMs} ms and was killed`,
    );
  }
  if (r.code !== 0)
    throw new InstallError('script-failed', `the install script "${script}" failed (${describeExit(r)})`);
}

/**
 * Installs the image (a tar.gz with `manifest.json` at its root) into the inactive slot and returns that slot and
 * the manifest. The active slot is never touched; the caller switches to the new slot when it decides to.
 */
export async function installImage(dir: string, imagePath: string, opts: InstallOptions = {}): Promise<InstallResult> {
  const tarTimeoutMs = opts.tarTimeoutMs ?? DEFAULT_TAR_TIMEOUT_MS;
  const run = opts.run ?? runInGroup;
  // Absolute, because the install script gets it in DEVCLOUD_SLOT and runs with the slot as its cwd.
  dir = resolve(dir);
  await ensureSlots(dir);
  const slot = await inactiveSlot(dir);
  const slotDir = join(dir, slot);
  const listing = opts.listing ?? (await runTar(['-tvzf', imagePath], tarTimeoutMs, 'list the image', run));
  checkMembers(listing, { maxBytes: opts.maxBytes ?? DEFAULT_MAX_BYTES, maxFiles: opts.maxFiles ?? DEFAULT_MAX_FILES });
  try {
    await rm(slotDir, { recursive: true, force: true });
    await mkdir(slotDir);
  } catch (err) {
    throw new InstallError('io', `cannot empty slot ${slot} at ${slotDir}: ${String(err)}`);
  }
  await runTar(
    ['-xzf', imagePath, '-C', slotDir, '--no-same-owner'],
    tarTimeoutMs,
    `unpack the image into slot ${slot}`,
    run,
  );
  try {
    await checkUnpacked(slotDir);
  } catch (err) {
    // What was refused is not left in the slot for anything to start.
    await rm(slotDir, { recursive: true, force: true }).catch(() => undefined);
    await mkdir(slotDir).catch(() => undefined);
    throw err;
  }
  const manifest = await readManifest(slotDir);
  if (manifest.install !== undefined) {
    await runInstallScript(slotDir, manifest.install, {
      timeoutMs: opts.scriptTimeoutMs ?? DEFAULT_SCRIPT_TIMEOUT_MS,
      env: opts.env ?? {},
      run,
    });
  }
  return { slot, manifest };
}
