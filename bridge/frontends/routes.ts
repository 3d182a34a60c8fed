/**
 * `GET /0/frontend` (docs/api.md): the frontend of the request (decision 15) and the switches of its product
 * configuration that decide what an app offers (decision 16): the nearby view (`nearby`) and claiming
 * (`registration`). An app built on the public API, the web console among them, reads it to hide what the
 * frontend does not offer instead of showing a view that stays empty or a button that always fails. It needs no
 * session: the frontend is known before anyone logs in, and nothing here is secret (its id is in every link).
 */
import { z } from 'zod';
import { sendJson } from '../http/reply.js';
import { type Route, named } from '../http/route.js';

export const FrontendInfo = z.object({
  id: z.guid().meta({ description: 'The frontend uuid: the `app` parameter, or the Host label, that names it.' }),
  name: z.string().meta({ description: 'Its name, as `devcloud-bridge frontend` set it.' }),
  nearby: z.boolean().meta({ description: 'Users may see nearby devices (`GET /0/network/`).' }),
  registration: z.boolean().meta({ description: 'Users may claim devices (`POST /0/devices/` with `auth`).' }),
});

export function frontendRoutes(): Route[] {
  return [
    {
      method: 'GET',
      path: '/0/frontend',
      operationId: 'getFrontend',
      tag: 'Meta',
      summary: 'The frontend of the request',
      description:
        'Decisions 15 and 16. The frontend the request names (the Host header, else `app`, else the default one) ' +
        'and its `nearby` and `registration` switches, so that an app shows the nearby view and the claim only ' +
        'where the frontend offers them. Needs no session. `Cache-Control: no-store`: an operator may change the ' +
        'switches at any time.',
      responses: {
        200: { description: 'The frontend.', json: named('Frontend', FrontendInfo) },
      },
      handler: async (req, reply) => {
        const f = req.frontend;
        const info = { id: f.id, name: f.name, nearby: f.config.nearby, registration: f.config.registration };
        return sendJson(reply, JSON.stringify(info));
      },
    },
  ];
}
