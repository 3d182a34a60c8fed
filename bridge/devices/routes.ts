/**
 * The Devices and Network sections of the specification: the user's devices, claim and unregister, variables
 * and their history, and the nearby view.
 *
 * Who may see a device (decisions 14 and 18, written up in docs/api.md):
 * - its owner, through its uuid or its auth code;
 * - while it has no owner, a user whose authcode it heard within the nearby window, when the frontend's
 *   `nearby` is on. Such a user may also read and set its variables (being near an unclaimed device is what
 *   claiming it takes, too). Unregistering needs the owner.
 * A device the caller may not see answers exactly as one that does not exist: `GET` 404 `device-fail`, `POST`
 * and `DELETE` 400 `device-fail`.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { type RouteContext, bodyIsFields, fields, query, readForm, send } from '../app.js';
import { ApiError } from '../errors.js';
import { deviceAccess, sendJson } from './access.js';
import { ClaimForm, HISTORY_MAX, HistoryQuery, VarNameParam, VarTypeParam, variableForm } from './schemas.js';
import type { VarType } from './store.js';
import { renderBare, renderCollection, renderHistory, renderRecord, renderVars } from './view.js';

type Params = { id?: string; type?: string; name?: string };

const json = sendJson;

export function registerDeviceRoutes(app: FastifyInstance, ctx: RouteContext): void {
  const { store, config, now, devices: service } = ctx;
  const devices = store.devices;
  const windowMs = config.devices.nearbyWindowMs;
  const maxValueBytes = config.devices.maxValueBytes;
  const VariableForm = variableForm(maxValueBytes);

  const { userOf, visible } = deviceAccess(ctx);

  /** The variable type and name of the path; `undefined` when either is malformed. */
  function variable(req: FastifyRequest): { type: VarType; name: string } | undefined {
    const p = req.params as Params;
    const type = VarTypeParam.safeParse(p.type);
    const name = VarNameParam.safeParse(p.name);
    return type.success && name.success ? { type: type.data, name: name.data } : undefined;
  }

  // ---- devices ----

  app.get('/0/devices', async (req, reply) => {
    const user = userOf(req);
    const owned = devices.deviceIdsOf(user.id);
    return json(reply, renderCollection(owned.map((id) => [id, devices.deviceJson(id)] as const)));
  });

  app.post('/0/devices', { config: { failToken: 'claim-fail' } }, async (req, reply) => {
    const user = userOf(req);
    const form = readForm(fields(req), ClaimForm);
    if (!req.frontend.config.registration || !form.auth.ok) throw new ApiError('claim-fail');
    const device = devices.deviceByAuthcode(form.auth.value);
    if (!device) throw new ApiError('claim-fail');
    const product = req.frontend.config;
    if (product.claimRequiresProximity && device.ownerId !== user.id) {
      if (!devices.heardBy(device.id, user.id, now() - windowMs)) throw new ApiError('claim-fail');
    }
    const outcome = await store.write(() => devices.claim(device.id, user.id, now()));
    if (outcome === 'taken') throw new ApiError('claim-fail');
    if (outcome === 'claimed') {
      ctx.log.info({ event: 'device.claimed', deviceId: device.id, userId: user.id });
      service.registrationChanged(device.id, true);
    }
    // Decision 8: the uuid as text, or `{"id": …}` to a client that asks for JSON.
    const accept = req.headers.accept ?? '';
    if (/\bapplication\/json\b/i.test(accept)) return json(reply, JSON.stringify({ id: device.id }), 201);
    return send(reply, 201, device.id);
  });

  app.get('/0/devices/:id', async (req, reply) => {
    const seen = visible(req, userOf(req));
    if (!seen) throw new ApiError('device-not-found');
    return json(reply, devices.deviceJson(seen.device.id));
  });

  app.delete('/0/devices/:id', { config: { failToken: 'device-fail' } }, async (req, reply) => {
    const user = userOf(req);
    const seen = visible(req, user);
    if (!seen?.owner) throw new ApiError('device-fail');
    const id = seen.device.id;
    const done = await store.write(() => {
      if (!devices.unregister(id, user.id)) return false;
      // The former owner's commands go with the registration.
      store.commands.deleteOfDevice(id);
      return true;
    });
    if (!done) throw new ApiError('device-fail');
    ctx.log.info({ event: 'device.unregistered', deviceId: id, userId: user.id });
    service.registrationChanged(id, false);
    return send(reply, 200, 'device-ok');
  });

  // ---- variables ----

  app.get('/0/devices/:id/:type', async (req, reply) => {
    const seen = visible(req, userOf(req));
    const type = VarTypeParam.safeParse((req.params as Params).type);
    if (!seen || !type.success) throw new ApiError('device-not-found');
    return json(reply, renderVars(devices.vars(seen.device.id, type.data)));
  });

  app.get('/0/devices/:id/:type/:name', { config: { failToken: 'device-fail' } }, async (req, reply) => {
    const seen = visible(req, userOf(req));
    const v = variable(req);
    if (!seen || !v) throw new ApiError('device-not-found');
    const q = query(req);
    if (q.latest !== undefined || q.from !== undefined) {
      const h = readForm(q, HistoryQuery);
      if (!h.latest.ok || !h.from.ok) throw new ApiError('device-fail');
      const asked = h.latest.value === undefined ? 0 : Number(h.latest.value);
      const limit = asked === 0 || asked > HISTORY_MAX ? HISTORY_MAX : asked;
      const before = h.from.value === undefined ? undefined : Number(h.from.value);
      return json(reply, renderHistory(devices.history(seen.device.id, v.type, v.name, limit, before)));
    }
    const rec = devices.getVar(seen.device.id, v.type, v.name);
    if (!rec || rec.value === null) throw new ApiError('device-not-found');
    // Decision 9: a meta variable reads as its bare value; `d` and `s` as records.
    return json(reply, v.type === 'meta' ? renderBare(rec) : renderRecord(rec)!);
  });

  app.post('/0/devices/:id/:type/:name', { config: { failToken: 'device-fail' } }, async (req, reply) => {
    const seen = visible(req, userOf(req));
    const v = variable(req);
    // Decision 22: meta variables are read-only.
    // A body that is not a set of fields is malformed, not "no value" (which would be a sync).
    if (!seen || !v || v.type === 'meta' || !bodyIsFields(req)) throw new ApiError('device-fail');
    const form = readForm(fields(req), VariableForm);
    if (!form.value.ok || !form.value64.ok) throw new ApiError('device-fail');
    let value: Buffer | undefined;
    if (form.value64.value !== undefined) value = Buffer.from(form.value64.value, 'base64');
    else if (form.value.value !== undefined) value = Buffer.from(form.value.value, 'utf8');
    if (value !== undefined && value.length > maxValueBytes) throw new ApiError('device-fail');
    const id = seen.device.id;
    let ok: boolean;
    if (value === undefined) {
      // Rule 3: a `d` variable with no value is synchronised; an `s` variable has nothing to sync.
      if (v.type !== 'd') throw new ApiError('device-fail');
      ok = await service.syncVar(id, v.name);
    } else {
      ok = await service.setVar(id, v.type, v.name, value);
    }
    if (!ok) throw new ApiError('device-fail');
    return send(reply, 200, 'device-ok');
  });

  app.delete('/0/devices/:id/:type/:name', { config: { failToken: 'device-fail' } }, async (req, reply) => {
    const seen = visible(req, userOf(req));
    const v = variable(req);
    if (!seen || !v || v.type === 'meta') throw new ApiError('device-fail');
    // Rule 4: deleting a `d` variable is a version too (a tombstone), synchronised with the device.
    if (!(await service.setVar(seen.device.id, v.type, v.name, null))) throw new ApiError('device-fail');
    return send(reply, 200, 'device-ok');
  });

  // ---- network ----

  app.get('/0/network', async (req, reply) => {
    const user = userOf(req);
    // Decision 18, subject to the product's `nearby`: a product without it shows an empty network.
    if (!req.frontend.config.nearby) return json(reply, '{}');
    const near = devices
      .nearbyOf(user.id, now() - windowMs)
      .filter((d) => d.authcode !== null && (d.ownerId === null || d.ownerId === user.id));
    return json(reply, renderCollection(near.map((d) => [d.authcode!, devices.deviceJson(d.id)] as const)));
  });
}
