/**
 * What the bridge adds to Fastify's request and route types: the frontend and session every request is read in
 * (`frontend.ts`), and the route each Fastify route was registered from (`server.ts`), which the error handler, the
 * frontend hook and the answer checker read.
 */
import type { FrontendSource } from '../frontends/resolve.js';
import type { Frontend, Session, User } from '../store/types.js';
import type { Route } from './route.js';

declare module 'fastify' {
  interface FastifyRequest {
    frontend: Frontend;
    frontendSource: FrontendSource;
    /** The valid session of this request in this frontend, if any. */
    session: Session | undefined;
    /** The logged-in user of the session, if any. */
    user: User | undefined;
  }
  interface FastifyContextConfig {
    /** The route this Fastify route was registered from; none on the not-found handler's route. */
    route?: Route;
  }
}
