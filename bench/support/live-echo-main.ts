/**
 * The live benchmark's baseline, in a process of its own: the bare broker of fleet-echo.ts (devices connect, say
 * hello and push as to the bridge, and get their answers) and a bare `ws` server in the same process, on
 * `GET /0/session/` with subprotocol `thsq-user`, that relays every pushed `d` item to the clients of its device at
 * once, as a frame of the bridge's shape and size: the bridge's own frames, captured by the clients earlier in the
 * same run, with the device and the value put in. A client's `{"delta":true}` gets the captured `devices` snapshot
 * in the same way. The session cookie only says which device a client watches: no store, no event bus, no
 * coalescing, no authentication.
 *
 * Arguments: the MQTT port, the HTTP port, and a JSON file of {@link LiveEchoConfig}.
 */
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { WebSocketServer, type WebSocket } from 'ws';
import { startEchoBroker } from './fleet-echo.js';
import { type LiveEchoConfig, fillFrame } from './live-clients.js';
import { wsText } from './ws-text.js';

const [mqttPort, httpPort, configFile] = process.argv.slice(2);
const config = JSON.parse(readFileSync(configFile!, 'utf8')) as LiveEchoConfig;
const deviceOf = new Map(config.clients.map((c) => [c.cookie, c.deviceId]));
const watchers = new Map<string, Set<WebSocket>>();

/**
 * The newest version relayed per device. aedes may hand over a device's pushes out of order when it is backed up
 * (seen after a stall of the machine: a burst of one device's pushes came out newest first); a version older than
 * one already relayed is dropped, as the bridge keeps only the newest version of a variable.
 */
const newest = new Map<string, number>();

await startEchoBroker(Number(mqttPort), 'live-echo', (deviceId, items) => {
  const set = watchers.get(deviceId);
  if (!set) return;
  for (const item of items) {
    if (item.type !== 'd' || typeof item.value !== 'string') continue;
    if (item.time <= (newest.get(deviceId) ?? -Infinity)) continue;
    newest.set(deviceId, item.time);
    const frame = fillFrame(config.delta, deviceId, item.value);
    for (const ws of set) ws.send(frame);
  }
});

const http = createServer((_req, res) => {
  res.statusCode = 404;
  res.end();
});
const wss = new WebSocketServer({
  server: http,
  perMessageDeflate: config.deflate,
  handleProtocols: (protocols) => (protocols.has('thsq-user') ? 'thsq-user' : false),
});
wss.on('connection', (ws, req) => {
  const sid = /(?:^|;\s*)sid=([^;]+)/.exec(req.headers.cookie ?? '')?.[1];
  const deviceId = sid === undefined ? undefined : deviceOf.get(sid);
  if (!req.url?.startsWith('/0/session/') || deviceId === undefined) {
    ws.close(1008, 'no session');
    return;
  }
  ws.on('message', (data) => {
    let msg: { delta?: unknown };
    try {
      msg = JSON.parse(wsText(data)) as { delta?: unknown };
    } catch {
      return;
    }
    if (msg.delta !== true) return;
    let set = watchers.get(deviceId);
    if (!set) watchers.set(deviceId, (set = new Set()));
    if (set.has(ws)) return;
    set.add(ws);
    ws.send(fillFrame(config.snapshot, deviceId));
  });
  ws.on('close', () => watchers.get(deviceId)?.delete(ws));
  ws.on('error', () => undefined);
});
http.listen(Number(httpPort), '127.0.0.1');
