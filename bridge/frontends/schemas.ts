/**
 * Decision 15: the `app` parameter, which names the frontend when the Host header does not. `resolve.ts` reads
 * it from the query or the form before any route runs; every request schema declares it too, so that the API
 * document (`bridge/openapi.ts`) lists it where clients send it. Not the form of `POST /0/user/`, where a field
 * `app` is user data (decision 25).
 */
import { z } from 'zod';

/** A frontend id. An id the bridge does not know answers 404 `not found`. */
export const AppParam = z.guid().meta({
  description:
    'The frontend (decision 15), when the Host header does not name one as `<uuid>.<server>`. Without either, ' +
    'the default frontend. An unknown frontend answers 404 `not found`.',
});

/**
 * The same parameter inside a form. The resolver has already acted on it (a value that is not one string names
 * no frontend and answers 404), so a route never fails on it.
 */
export const AppField = AppParam.optional().catch(undefined);
