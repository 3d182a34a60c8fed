/**
 * Headers on every answer that keep a browser from misreading or framing it (docs/api.md, Conventions):
 * `X-Content-Type-Options: nosniff` on all of them, and on every HTML page (the page a recovery link opens) a
 * Content Security Policy that allows no script, style, image or connection at all, forms posted back to the bridge
 * only, and no framing (`frame-ancestors 'none'`, and `X-Frame-Options: DENY` for older browsers). The web console's
 * page sets its own policy: its script and style from the bridge, connections to the bridge only, no framing.
 */
import type { FastifyInstance, FastifyReply } from 'fastify';

/** The policy of the bridge's HTML pages: plain forms with no script or style of their own. */
export const HTML_CSP = "default-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/** The header of every answer; also for the answers Fastify's router sends without running the hooks. */
export function noSniff(reply: FastifyReply): FastifyReply {
  return reply.header('x-content-type-options', 'nosniff');
}

export function registerSecurityHeaders(app: FastifyInstance): void {
  app.addHook('onSend', (_req, reply, payload, done) => {
    noSniff(reply);
    const type = reply.getHeader('content-type');
    if (typeof type === 'string' && type.startsWith('text/html')) {
      // The web console's page brings a policy of its own, which lets it load its script and style (docs/console.md).
      if (!reply.hasHeader('content-security-policy')) reply.header('content-security-policy', HTML_CSP);
      reply.header('x-frame-options', 'DENY');
    }
    done(null, payload);
  });
}
