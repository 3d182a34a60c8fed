/**
 * The web console (docs/console.md): the files `npm run build` made in dist/console/ (scripts/build-console.ts),
 * served at `/console/` on every frontend. They are read once, at the first request, and kept in memory with their
 * gzip; a browser that takes gzip gets that. The console calls the public API only, so the files need nothing of
 * the request: no frontend, no session.
 */
import { readFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from '../../lib/log.js';
import type { Route } from '../http/route.js';

const TYPES: Record<string, string> = {
  html: 'text/html; charset=utf-8',
  js: 'text/javascript; charset=utf-8',
  css: 'text/css; charset=utf-8',
};

/** What a page of the console may load: itself, and the bridge's API and live channel (same origin). */
const CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
  "frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

interface File {
  body: Buffer;
  gzip: Buffer | undefined;
  type: string;
}

/** dist/console of this installation: beside the bridge's own code when it runs built, else under the checkout. */
export function consoleDir(): string {
  // dist/bridge/console/routes.js → dist/console; bridge/console/routes.ts (run by tsx) → dist/console of the checkout.
  const top = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
  return basename(top) === 'dist' ? join(top, 'console') : join(top, 'dist', 'console');
}

export function consoleRoutes(deps: { log: Logger; dir?: string }): Route[] {
  const dir = deps.dir ?? consoleDir();
  const files = new Map<string, File | null>();
  let warned = false;

  const file = (name: string): File | undefined => {
    if (!/^(index\.html|app\.js|style\.css)$/.test(name)) return undefined;
    const held = files.get(name);
    if (held !== undefined) return held ?? undefined;
    let body: Buffer;
    try {
      body = readFileSync(join(dir, name));
    } catch {
      if (!warned) {
        warned = true;
        deps.log.warn({ event: 'console.missing', dir });
      }
      return undefined;
    }
    let gzip: Buffer | undefined;
    try {
      gzip = readFileSync(join(dir, `${name}.gz`));
    } catch {
      gzip = undefined;
    }
    const f = { body, gzip, type: TYPES[name.slice(name.lastIndexOf('.') + 1)]! };
    files.set(name, f);
    return f;
  };

  const serve = (name: string, req: FastifyRequest, reply: FastifyReply) => {
    const f = file(name);
    if (!f) return reply.code(404).type('text/plain; charset=utf-8').send('not found');
    const gzip = f.gzip !== undefined && /\bgzip\b/.test(String(req.headers['accept-encoding'] ?? ''));
    reply
      .code(200)
      .type(f.type)
      .header('cache-control', 'no-cache')
      .header('content-security-policy', CSP)
      .header('x-content-type-options', 'nosniff')
      .header('referrer-policy', 'same-origin')
      .header('vary', 'accept-encoding');
    if (gzip) reply.header('content-encoding', 'gzip');
    return reply.send(gzip ? f.gzip : f.body);
  };

  const notFound = { description: 'No such file of the console, or the console was not built.', tokens: ['not found'] };

  return [
    {
      method: 'GET',
      path: '/console/',
      operationId: 'console',
      tag: 'Meta',
      summary: 'The web console',
      description:
        'The web console (docs/console.md): one page that calls this API and its live channel. Open ' +
        '`/console/?app=<frontend>` for a frontend other than the one the Host header names.',
      device: true,
      // The page itself: always HTML.
      responses: { 200: { description: 'The page.', html: true }, 404: notFound },
      handler: (req, reply) => Promise.resolve(serve('index.html', req, reply)),
    },
    {
      method: 'GET',
      path: '/console/{file}',
      operationId: 'consoleFile',
      tag: 'Meta',
      summary: 'A file of the web console',
      description: '`app.js`, `style.css` or `index.html`, gzipped for a client that takes it.',
      device: true,
      responses: { 200: { description: 'The file.', asset: true }, 404: notFound },
      handler: (req, reply) => Promise.resolve(serve((req.params as { file?: string }).file ?? '', req, reply)),
    },
  ];
}
