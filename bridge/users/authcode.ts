/**
 * A user's authcode (decision 17): 128 random bits the user's phone broadcasts on UDP 590, so that devices can
 * report who is near them. It rotates every 24 hours; the previous one still matches for an hour, so that a phone
 * that has not fetched the new one yet is still recognised.
 */
import { randomBytes } from 'node:crypto';
import type { BridgeStore, StoreTx, User } from '../store/types.js';

export const AUTHCODE_ROTATE_MS = 24 * 3_600_000;
export const AUTHCODE_GRACE_MS = 3_600_000;

export function newAuthcode(): string {
  return randomBytes(16).toString('hex');
}

/** The user's authcode now, rotating it first when it is older than a day. */
export async function currentAuthcode(store: BridgeStore, user: User, now: number): Promise<string> {
  if (now - user.authcodeRotatedAt < AUTHCODE_ROTATE_MS) return user.authcode;
  return store.write(async (tx) => {
    // Read again inside the transaction: a concurrent request may have rotated it already.
    const fresh = await tx.userById(user.id, { forUpdate: true });
    if (!fresh || now - fresh.authcodeRotatedAt < AUTHCODE_ROTATE_MS) return fresh?.authcode ?? user.authcode;
    const authcode = newAuthcode();
    await tx.updateUser(user.id, { authcode, authcodePrev: fresh.authcode, authcodeRotatedAt: now });
    return authcode;
  });
}

/** The user an authcode heard from a phone belongs to: the current one, or the previous one within its hour. */
export async function userOfAuthcode(store: StoreTx, authcode: string, now: number): Promise<User | undefined> {
  const user = await store.userByAuthcode(authcode);
  if (!user) return undefined;
  if (user.authcode === authcode) return user;
  return now - user.authcodeRotatedAt < AUTHCODE_GRACE_MS ? user : undefined;
}
