/**
 * The bridge's error catalog (docs/decisions.md, principle 5): every failure a route can answer is one code here, mapped
 * once to its HTTP status and its plain-text body token (the specification's Errors table and docs/decisions.md
 * §2). Routes throw or return codes; nothing is classified by message text.
 */
export const ERRORS = {
  'login-fail': { status: 403, body: 'login-fail' },
  'logout-fail': { status: 400, body: 'logout-fail' },
  'signup-fail-no-email': { status: 400, body: 'signup-fail-no-email' },
  'signup-fail-already-exists': { status: 400, body: 'signup-fail-already-exists' },
  /** Decision 4: a signup whose other fields are missing or malformed (a password out of bounds). */
  'signup-fail': { status: 400, body: 'signup-fail' },
  'resend-fail': { status: 400, body: 'resend-fail' },
  'recover-fail': { status: 400, body: 'recover-fail' },
  'confirm-fail': { status: 400, body: 'confirm-fail' },
  /** The specification's 404 for `GET /0/user/` with no user session, and an unknown frontend (decision 15). */
  'not-found': { status: 404, body: 'not found' },
  /** The specification: user data too large. */
  'user-data-failed': { status: 413, body: 'user-data-failed' },
  /** Decisions 4 and 29: a `POST /0/user/` that is not a set of string fields; the specification's token. */
  'user-data-malformed': { status: 400, body: 'user-data-failed' },
  /** Decision 3: an endpoint that needs a session, called without a valid one. */
  'no-session': { status: 401, body: 'no-session' },
  /** Decision 14: a device route with an unknown or invisible device or variable, on `GET`. */
  'device-not-found': { status: 404, body: 'device-fail' },
  /** The specification: a device or variable that could not be found, set or deleted; malformed input (decision 4). */
  'device-fail': { status: 400, body: 'device-fail' },
  /** Decision 26: a variable's `timestamp` at or before its held version's time, which would lose at once. */
  'device-fail-older': { status: 409, body: 'device-fail-older' },
  'claim-fail': { status: 400, body: 'claim-fail' },
  /**
   * Decision 23: a share or its revocation refused: not the device's owner (or the shared user themself, for a
   * revocation), no such user in the frontend, the owner themself, no such share, malformed input.
   */
  'share-fail': { status: 400, body: 'share-fail' },
  /** Decision 23: the list of a device's shared users, asked by a user the device is only shared with. */
  'share-list-fail': { status: 403, body: 'share-fail' },
  /**
   * Decision 30: `POST /0/session/` with a `token` that is no access token (malformed, unknown, revoked, of another
   * frontend's user). The request's session is replaced by a new anonymous one all the same.
   */
  'token-fail': { status: 401, body: 'token-fail' },
  /** Decision 30: revoking an access token the user does not have; a malformed body. */
  'accesstoken-fail': { status: 400, body: 'accesstoken-fail' },
  /** Decision 30: the user already has `accounts.accessTokensPerUser` access tokens. */
  'accesstoken-fail-limit': { status: 400, body: 'accesstoken-fail-limit' },
  /** Decision 30: a session started with an access token may not make more of them. */
  'accesstoken-fail-token-session': { status: 403, body: 'accesstoken-fail-token-session' },
  /** docs/notifications.md: no such rule of the user, on `GET /0/user/event/<id>`. */
  'event-not-found': { status: 404, body: 'event-fail' },
  /** docs/notifications.md: no such rule of the user; a malformed field or body. */
  'event-fail': { status: 400, body: 'event-fail' },
  /** docs/notifications.md: `deviceid` names no device the user owns or has shared with them. */
  'event-fail-device': { status: 400, body: 'event-fail-device' },
  /** docs/notifications.md: a `webhook` that is no URL the bridge may POST to. */
  'event-fail-webhook': { status: 400, body: 'event-fail-webhook' },
  /** docs/notifications.md: the user already has `notifications.rulesPerUser` rules. */
  'event-fail-limit': { status: 400, body: 'event-fail-limit' },
  /** The specification: no firmware image of that name (also a name that cannot be one). */
  'device-fwup-name-fail': { status: 400, body: 'device-fwup-name-fail' },
  /** docs/decisions.md §7: the device is not connected in `d` mode and `meta` state, its platform is not in the
   * image's `from`, or an update is already running. */
  'device-fwup-start-fail': { status: 400, body: 'device-fwup-start-fail' },
  /** Nothing to cancel, or the update is past the switch (decision 7). */
  'firmware-fail': { status: 400, body: 'firmware-fail' },
  /** An image download without a valid job token. */
  'fw-token-fail': { status: 401, body: 'unauthorized' },
  /** A job's image whose file this bridge does not have (docs/scaling.md, "Firmware images with several bridges"). */
  'fw-image-missing': { status: 404, body: 'not found' },
  /** A state-changing request from a page of another site (bridge/sessions/origin.ts). */
  'origin-fail': { status: 403, body: 'origin-fail' },
  'too-many-requests': { status: 429, body: 'too-many-requests' },
  /** The password hashing queue is full: try again shortly. */
  busy: { status: 503, body: 'busy' },
  /** The data directory's disk is full: the change was not made; reads still work (docs/api.md, Errors). */
  'storage-full': { status: 507, body: 'storage-full' },
  internal: { status: 500, body: 'internal-error' },
} as const satisfies Record<string, { status: number; body: string }>;

export type ErrorCode = keyof typeof ERRORS;

/** A failure with a code from the catalog; `retryAfterMs` becomes a `Retry-After` header. */
export class ApiError extends Error {
  override name = 'ApiError';
  constructor(
    readonly code: ErrorCode,
    readonly retryAfterMs?: number,
  ) {
    super(code);
  }
}

export function isApiError(err: unknown): err is ApiError {
  return err instanceof ApiError;
}
