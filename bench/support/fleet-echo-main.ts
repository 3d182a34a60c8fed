/**
 * The fleet benchmark's baseline: a bare aedes broker in its own process, on the port given as the only argument,
 * with a subscriber inside it that answers devices as the bridge does on the wire and does nothing else: a hello
 * that asks for the clock gets a `down/vars` with `now`, an `up/vars` gets a `down/acks` naming every item. No
 * authentication, no validation, no database: what the simulator, the sockets and the broker cost by themselves.
 * aedes is set up as the bridge sets it up (bridge/broker.ts): its retained messages by topic level, no table of
 * packet-id buffers.
 */
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { Aedes, type AedesPublishPacket } from 'aedes';
import { indexedMemoryPersistence } from '../../bridge/retained.js';

const aedesEntry = createRequire(import.meta.url).resolve('aedes');
const writer = createRequire(aedesEntry)('mqtt-packet') as { writeToStream?: { cacheNumbers?: boolean } };
if (writer.writeToStream) writer.writeToStream.cacheNumbers = false;

const port = Number(process.argv[2]);
const broker = await Aedes.createBroker({ id: 'fleet-echo', persistence: indexedMemoryPersistence() });
let seq = 0;

function send(deviceId: string, name: string, payload: object): void {
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
}

interface Item {
  kind: string;
  type: string;
  name: string;
  time: number;
  origin: string;
  synced?: number;
}

const deliver = (packet: AedesPublishPacket, done: () => void): void => {
  done();
  const [, , deviceId, , name] = packet.topic.split('/');
  if (deviceId === undefined) return;
  if (name === 'hello') {
    const hello = JSON.parse(packet.payload.toString()) as { clock?: boolean };
    if (hello.clock === true) send(deviceId, 'down/vars', { items: [], now: Date.now() });
  } else if (name === 'vars') {
    const msg = JSON.parse(packet.payload.toString()) as { items: Item[] };
    const acks = msg.items.map(({ kind, type, name: n, time, origin, synced }) =>
      synced === undefined ? { kind, type, name: n, time, origin } : { kind, type, name: n, time, origin, synced },
    );
    send(deviceId, 'down/acks', { acks, now: Date.now() });
  }
};
await new Promise<void>((resolve) => broker.subscribe('dc/v1/+/up/#', deliver, resolve));

const server = createServer({ noDelay: true }, (socket) => broker.handle(socket));
server.listen(port, '127.0.0.1');
