/**
 * The device's identity (docs/decisions.md §5): uuid, secret (its broker password) and auth code (its claim
 * token). Taken from a provisioning file at first start, or made here when there is none (open enrolment);
 * kept in `<stateDir>/identity.json`, mode 0600, written atomically.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { chmodSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { writeFileAtomic } from '../lib/fsutil.js';
import { DeviceAuthcode, Uuid } from '../protocol/index.js';

export const Identity = z
  .object({
    deviceId: Uuid,
    secret: z.string().min(16).max(256),
    authcode: DeviceAuthcode,
  })
  .strict();
export type Identity = z.infer<typeof Identity>;

/** A provisioning file may carry more (broker URL, CA) for later use; the identity is what is read here. */
const ProvisioningFile = z.object({ deviceId: Uuid, secret: z.string().min(16).max(256), authcode: DeviceAuthcode });

export class IdentityError extends Error {
  override name = 'IdentityError';
}

export function identityPath(stateDir: string): string {
  return join(stateDir, 'identity.json');
}

export interface LoadedIdentity {
  identity: Identity;
  source: 'state' | 'provisioned' | 'generated';
}

function readJson(path: string): unknown {
  const text = readFileSync(path, 'utf8');
  try {
    return JSON.parse(text) as unknown;
  } catch {
    // V8's message quotes the text around the error, which may be part of the secret: it would reach the log.
    throw new SyntaxError('not valid JSON');
  }
}

/** The first problem with the key it concerns; never the value, which may be the secret. */
function firstIssue(error: z.ZodError): string {
  const issue = error.issues[0];
  if (!issue) return 'invalid';
  return issue.path.length > 0 ? `${issue.path.join('.')}: ${issue.message}` : issue.message;
}

/** Loads the identity, making and storing it at first start. Throws {@link IdentityError} on a bad file. */
export function loadIdentity(stateDir: string, provisioningFile: string | undefined): LoadedIdentity {
  const path = identityPath(stateDir);
  let raw: unknown;
  try {
    raw = readJson(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') {
      throw new IdentityError(`identity file ${path} cannot be read: ${(err as Error).message}`);
    }
  }
  if (raw !== undefined) {
    const parsed = Identity.safeParse(raw);
    if (!parsed.success) throw new IdentityError(`identity file ${path} is invalid: ${firstIssue(parsed.error)}`);
    // Keep the secret private even if someone loosened the mode by hand.
    chmodSync(path, 0o600);
    return { identity: parsed.data, source: 'state' };
  }

  let identity: Identity;
  let source: LoadedIdentity['source'];
  if (provisioningFile !== undefined) {
    let prov: unknown;
    try {
      prov = readJson(provisioningFile);
    } catch (err) {
      throw new IdentityError(`provisioning file ${provisioningFile} cannot be read: ${(err as Error).message}`);
    }
    const parsed = ProvisioningFile.safeParse(prov);
    if (!parsed.success) {
      throw new IdentityError(`provisioning file ${provisioningFile} is invalid: ${firstIssue(parsed.error)}`);
    }
    identity = { deviceId: parsed.data.deviceId, secret: parsed.data.secret, authcode: parsed.data.authcode };
    source = 'provisioned';
  } else {
    identity = {
      deviceId: randomUUID(),
      secret: randomBytes(32).toString('hex'),
      authcode: randomBytes(16).toString('hex'),
    };
    source = 'generated';
  }
  writeFileAtomic(path, `${JSON.stringify(identity, null, 2)}\n`, 0o600);
  return { identity, source };
}
