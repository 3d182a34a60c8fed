/**
 * The two kinds of answer most routes give: a plain-text token (docs/api.md, Conventions), and JSON that no cache
 * keeps.
 */
import type { FastifyReply } from 'fastify';

export function send(reply: FastifyReply, status: number, token: string): FastifyReply {
  return reply.code(status).type('text/plain; charset=utf-8').send(token);
}

const JSON_TYPE = 'application/json; charset=utf-8';

/** A JSON answer that no cache keeps. */
export function sendJson(reply: FastifyReply, body: string | Buffer, status = 200): FastifyReply {
  return reply.code(status).header('cache-control', 'no-store').type(JSON_TYPE).send(body);
}
