/**
 * The Firmware section of the specification: `GET /0/firmware/`, the catalog as a JSON array of firmware image
 * objects, ordered by name, then version. Any logged-in user may list it; the sha256 and signature of each
 * image go to devices with their jobs, not here.
 */
import type { FastifyInstance } from 'fastify';
import type { RouteContext } from '../app.js';
import { deviceAccess, sendJson } from '../devices/access.js';
import { firmwareJson } from './catalog.js';

export function registerFirmwareRoutes(app: FastifyInstance, ctx: RouteContext): void {
  const { userOf } = deviceAccess(ctx);
  const catalog = ctx.store.firmware;

  app.get('/0/firmware', async (req, reply) => {
    userOf(req);
    return sendJson(reply, JSON.stringify(catalog.list().map(firmwareJson)));
  });
}
