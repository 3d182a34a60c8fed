/**
 * A bare aedes broker with a subscriber inside it that answers devices as the bridge does on the wire and does
 * nothing else: a hello that asks for the clock gets a `down/vars` with `now`, an `up/vars` gets a `down/acks`
 * naming every item. No authentication, no validation, no database: what the simulator, the sockets and the broker
 * cost by themselves. aedes is set up as the bridge sets it up (bridge/broker.ts): its retained messages by topic
 * level, no table of packet-id buffers. The fleet benchmark's baseline (fleet-echo-main.ts) and the live
 * benchmark's (live-echo-main.ts), which also relays each pushed item to WebSocket clients (`onItems`).
 */
import { createRequire } from 'node:module';
import { type Server, createServer } from 'node:net';
import { Aedes, type AedesPublishPacket } from 'aedes';
import { indexedMemoryPersistence } from '../../bridge/retained.js';

const aedesEntry = createRequire(import.meta.url).resolve('aedes');
const writer = createRequire(aedesEntry)('mqtt-packet') as { writeToStream?: { cacheNumbers?: boolean } };
if (writer.writeToStream) writer.writeToStream.cacheNumbers = false;

export interface EchoItem {
  kind: string;
  type: string;
  name: string;
  value?: string;
  time: number;
  origin: string;
  synced?: number;
}

/** Listens on 127.0.0.1:`port`; `onItems` sees the items of every `up/vars`, after its acknowledgement is sent. */
export async function startEchoBroker(
  port: number,
  id: string,
  onItems?: (deviceId: string, items: readonly EchoItem[]) => void,
): Promise<Server> {
  const broker = await Aedes.createBroker({ id, persistence: indexedMemoryPersistence() });
  let seq = 0;

  const send = (deviceId: string, name: string, payload: object): void => {
    broker.publish(
      {
        cmd: 'publish',
        topic: `dc/v1/${deviceId}/${name}`,
        payload: Buffer.from(JSON.stringify({ id: `e${(++seq).toString(36)}`, ...payload })),
        qos: 1,
        retain: false,
        dup: false,
      },
      () => undefined,
    );
  };

  const deliver = (packet: AedesPublishPacket, done: () => void): void => {
    done();
    const [, , deviceId, , name] = packet.topic.split('/');
    if (deviceId === undefined) return;
    if (name === 'hello') {
      const hello = JSON.parse(packet.payload.toString()) as { clock?: boolean };
      if (hello.clock === true) send(deviceId, 'down/vars', { items: [], now: Date.now() });
    } else if (name === 'vars') {
      const msg = JSON.parse(packet.payload.toString()) as { items: EchoItem[] };
      const acks = msg.items.map(({ kind, type, name: n, time, origin, synced }) =>
        synced === undefined ? { kind, type, name: n, time, origin } : { kind, type, name: n, time, origin, synced },
      );
      send(deviceId, 'down/acks', { acks, now: Date.now() });
      onItems?.(deviceId, msg.items);
    }
  };
  await new Promise<void>((resolve) => broker.subscribe('dc/v1/+/up/#', deliver, resolve));

  const server = createServer({ noDelay: true }, (socket) => broker.handle(socket));
  server.listen(port, '127.0.0.1');
  return server;
}
