/**
 * The baseline of the REST benchmarks: Fastify with the bridge's server options, answering `GET /0/user/` with
 * the bytes given (base64, second argument) and `POST /0/session/` with `user-ok`, with the same statuses and
 * content types as the bridge and no work behind them. An optional third argument names a JSON file of more
 * `GET` routes, `{ "<path>": "<JSON body>" }`, each answered the same way from memory. Listens on 127.0.0.1
 * and the port given as the first argument, until killed.
 */
import { readFileSync } from 'node:fs';
import Fastify from 'fastify';

const port = Number(process.argv[2]);
const userBody = Buffer.from(process.argv[3] ?? '', 'base64').toString('utf8');
const routesFile = process.argv[4];
const routes = routesFile ? (JSON.parse(readFileSync(routesFile, 'utf8')) as Record<string, string>) : {};

const app = Fastify({ logger: false, routerOptions: { ignoreTrailingSlash: true }, return503OnClosing: true });

// Async handlers like the bridge's routes, so that the difference is the work, not the handler's shape.
app.get('/0/user', async (_req, reply) =>
  reply.code(200).header('cache-control', 'no-store').type('application/json; charset=utf-8').send(userBody),
);
app.post('/0/session', async (_req, reply) => reply.code(200).type('text/plain; charset=utf-8').send('user-ok'));
for (const [path, body] of Object.entries(routes)) {
  app.get(path, async (_req, reply) =>
    reply.code(200).header('cache-control', 'no-store').type('application/json; charset=utf-8').send(body),
  );
}

await app.listen({ host: '127.0.0.1', port });

// Exit through process.exit on a signal, so that `--cpu-prof` (when given) writes its profile.
for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  process.once(signal, () => void app.close().finally(() => process.exit(0)));
}
