/**
 * The embedded broker's retained messages (bridge/broker.ts), kept in a tree of topic levels so that a
 * subscription finds the ones it matches without looking at the others.
 *
 * aedes keeps its state in aedes-persistence's in-memory store, which holds retained messages in one map and, for
 * every SUBSCRIBE, tests each of them against the subscription's filter. Every device publishes a retained `state`
 * and subscribes once per connection (docs/protocol.md, "Connecting"), so with N devices each connection cost a
 * scan of N messages, and a fleet reconnecting N² tests: with 10,000 devices over half of the bridge's CPU while
 * they connected (`npm run bench -- fleet`, bench/README.md). Here a filter visits only the branches its levels
 * name: a device's `dc/v1/<id>/down/#` looks at one branch, which holds no retained message.
 *
 * The rest of aedes' store (subscriptions, wills, messages in flight) is aedes-persistence's, unchanged.
 */
import { createRequire } from 'node:module';
import { Readable } from 'node:stream';

/** What the tree needs of a retained packet; aedes passes and gets back its whole packet. */
export interface RetainedPacket {
  topic: string;
  payload: Buffer | string;
}

interface Level<P> {
  packet?: P | undefined;
  children?: Map<string, Level<P>>;
}

/**
 * Retained messages by topic, matched against MQTT filters (MQTT 3.1.1, 4.7): `+` is one level, `#` any number of
 * levels including none (`a/#` matches `a`), and a wildcard in the first level does not match a topic that starts
 * with `$` (4.7.2). An empty payload removes the topic's message (3.3.1.3).
 */
export class RetainedTree<P extends RetainedPacket = RetainedPacket> {
  private readonly root: Level<P> = {};
  private count = 0;

  get size(): number {
    return this.count;
  }

  store(packet: P): void {
    const levels = packet.topic.split('/');
    if (packet.payload.length === 0) {
      this.remove(levels);
      return;
    }
    let node = this.root;
    for (const name of levels) {
      node.children ??= new Map();
      let next = node.children.get(name);
      if (!next) {
        next = {};
        node.children.set(name, next);
      }
      node = next;
    }
    if (!node.packet) this.count++;
    node.packet = packet;
  }

  private remove(levels: readonly string[]): void {
    const path: Array<Level<P>> = [this.root];
    for (const name of levels) {
      const next = path[path.length - 1]!.children?.get(name);
      if (!next) return;
      path.push(next);
    }
    const node = path[path.length - 1]!;
    if (!node.packet) return;
    node.packet = undefined;
    this.count--;
    // Branches left with nothing in them go, so that the tree holds no more than the topics retained.
    for (let i = levels.length; i > 0; i--) {
      const n = path[i]!;
      if (n.packet || (n.children && n.children.size > 0)) break;
      path[i - 1]!.children!.delete(levels[i - 1]!);
    }
  }

  /** The retained messages whose topics match `filter`. */
  *match(filter: string): Generator<P> {
    yield* matchLevels(this.root, filter.split('/'), 0);
  }
}

function* matchLevels<P>(node: Level<P>, filter: readonly string[], i: number): Generator<P> {
  if (i === filter.length) {
    if (node.packet) yield node.packet;
    return;
  }
  const name = filter[i]!;
  if (name === '#') {
    yield* everything(node, i === 0);
    return;
  }
  if (!node.children) return;
  if (name === '+') {
    for (const [level, child] of node.children) {
      if (i === 0 && level.startsWith('$')) continue;
      yield* matchLevels(child, filter, i + 1);
    }
    return;
  }
  const child = node.children.get(name);
  if (child) yield* matchLevels(child, filter, i + 1);
}

/** The message of `node` and of every level below it. */
function* everything<P>(node: Level<P>, atRoot: boolean): Generator<P> {
  if (node.packet) yield node.packet;
  if (!node.children) return;
  for (const [level, child] of node.children) {
    if (atRoot && level.startsWith('$')) continue;
    yield* everything(child, false);
  }
}

/** The methods of aedes-persistence's store that deal with retained messages. */
interface RetainedMethods {
  storeRetained(packet: RetainedPacket, cb?: (err: Error | null) => void): Promise<void> | undefined;
  createRetainedStream(filter: string): Readable;
  createRetainedStreamCombi(filters: string[]): Readable;
}

/**
 * aedes' in-memory store (the copy of aedes-persistence that aedes itself loads) with its retained messages in a
 * {@link RetainedTree}; for `Aedes.createBroker({ persistence })`.
 */
export function indexedMemoryPersistence(): object {
  const fromAedes = createRequire(createRequire(import.meta.url).resolve('aedes'));
  const memory = fromAedes('aedes-persistence') as () => RetainedMethods;
  const persistence = memory();
  const tree = new RetainedTree();
  persistence.storeRetained = (packet, cb) => {
    // A copy, as aedes-persistence keeps: the broker goes on using the packet it passed.
    tree.store({ ...packet });
    if (!cb) return Promise.resolve();
    process.nextTick(cb, null);
    return undefined;
  };
  persistence.createRetainedStream = (filter) => Readable.from(tree.match(filter));
  persistence.createRetainedStreamCombi = (filters) =>
    Readable.from(
      (function* () {
        for (const filter of filters) yield* tree.match(filter);
      })(),
    );
  return persistence;
}
