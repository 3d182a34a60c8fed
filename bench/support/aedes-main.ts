/**
 * aedes in a process of its own for `--broker aedes`, on the port given as the only argument, until killed.
 */
import { createServer } from 'node:net';
import { Aedes } from 'aedes';

const port = Number(process.argv[2]);
const broker = await Aedes.createBroker();
// TCP_NODELAY, like the Mosquitto the benchmark starts (see processes.ts).
const server = createServer({ noDelay: true }, (socket) => broker.handle(socket));
server.listen(port, '127.0.0.1');
