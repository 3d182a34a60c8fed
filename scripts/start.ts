/**
 * `npm start`: the bridge (REST API and embedded MQTT broker) and one local agent, so that a newcomer sees
 * devcloud work at once. State lives under ./var. Ports: 8080 for HTTP and 1883 for MQTT when free, else free
 * ones; UDP 590 for authcodes when run as root, else a free unprivileged port. It says which it picked.
 */
import { createSocket } from 'node:dgram';
import { createServer } from 'node:net';
import { resolve } from 'node:path';
import { Agent } from '../agent/agent.js';
import { loadAgentConfig } from '../agent/config.js';
import { Bridge } from '../bridge/bridge.js';
import { loadBridgeConfig } from '../bridge/config.js';
import { SqliteStore } from '../bridge/store/sqlite.js';
import { ConfigError } from '../lib/config.js';
import { writeFileAtomic } from '../lib/fsutil.js';
import { createLogger } from '../lib/log.js';

async function tcpPortFree(port: number, host: string): Promise<boolean> {
  const srv = createServer();
  return new Promise((done) => {
    srv.once('error', () => done(false));
    srv.listen(port, host, () => srv.close(() => done(true)));
  });
}

async function udpPortFree(port: number): Promise<boolean> {
  const s = createSocket('udp4');
  return new Promise((done) => {
    s.once('error', () => done(false));
    s.bind(port, () => s.close(() => done(true)));
  });
}

const host = '127.0.0.1';
const root = resolve(import.meta.dirname, '..');
const stateDir = resolve(root, 'var/agent');
const log = createLogger({ level: 'info', pretty: 'auto', base: { service: 'devcloud-bridge' } });
const agentLog = createLogger({ level: 'info', pretty: 'auto', base: { service: 'devcloud-agent' } });

const mqttPort = (await tcpPortFree(1883, host)) ? 1883 : 0;
const httpPort = (await tcpPortFree(8080, host)) ? 8080 : 0;
// Open enrolment (trust on first use), so that the local agent, and any other started by hand, connects at once;
// `devcloud-bridge run` has it off (docs/operations.md, "Enrolment").
const bridgeConfig = loadBridgeConfig(
  {
    dataDir: resolve(root, 'var/bridge'),
    host,
    'http.port': httpPort,
    'mqtt.port': mqttPort,
    'mqtt.openEnrolment': true,
  },
  {},
);
const store = new SqliteStore(bridgeConfig.dataDir, log, { backgroundCheckpoints: true });
const bridge = await Bridge.start({ config: bridgeConfig, store, log, now: Date.now });
const closeBridge = async () => {
  await bridge.stop();
  await store.close();
};
const broker = bridge.broker!;

const isRoot = process.getuid?.() === 0;
let udpPort = 590;
if (!isRoot || !(await udpPortFree(590))) udpPort = (await udpPortFree(5590)) ? 5590 : 0;

let agent: Agent;
try {
  const config = loadAgentConfig({
    flags: { stateDir, 'mqtt.url': broker.url, 'udp.port': udpPort, 'mqtt.backoffMaxMs': 5000 },
    env: {},
  });
  agent = await Agent.start({ config, log: agentLog, env: {} });
} catch (err) {
  console.error(err instanceof ConfigError ? err.message : `cannot start the agent: ${String(err)}`);
  await closeBridge();
  process.exit(1);
}

const socket = resolve(stateDir, 'agent.sock');
const credFile = resolve(root, 'var/mqtt-bridge.password');
writeFileAtomic(credFile, broker.bridgePassword, 0o600);
const rel = (p: string) => p.replace(`${root}/`, '');
const heardPort = agent.nearby.port ?? udpPort;
const url = bridge.url;
console.log(`
devcloud is running.
  REST API               ${url}${httpPort === 0 ? '   (8080 was taken, so a free port was picked)' : ''}
  web console            ${url}/console/   (sign up there; the Nearby page shows the agent once you send the authcode)
  default frontend       ${bridge.defaultFrontend.id}
  MQTT broker (embedded) ${broker.url}${mqttPort === 0 ? '   (1883 was taken, so a free port was picked)' : ''}
  agent                  device ${agent.identity.deviceId}, state in ${rel(stateDir)}
  authcodes              UDP ${heardPort}${udpPort !== 590 ? '   (590 needs root or CAP_NET_BIND_SERVICE, so an unprivileged port was picked)' : ''}

Try the REST API, in another terminal (bash; the cookie jar file ./jar keeps the session; confirmation
mails land in var/bridge/outbox):
  curl -c jar -b jar -X POST ${url}/0/session/signup -d login=you@example.com -d password=change-me-now
  curl -c jar -b jar ${url}/0/user/
  AUTHCODE=$(curl -s -b jar ${url}/0/user/ | sed -E 's/.*"authcode":"([0-9a-f]+)".*/\\1/')
  printf '%s\\n' "$AUTHCODE" > /dev/udp/127.0.0.1/${heardPort}     # what a phone broadcasts on UDP 590
  curl -b jar ${url}/0/network/                     # the agent heard you: its device is nearby
  curl -b jar -X POST ${url}/0/devices/ -d auth=${agent.identity.authcode}
  curl -b jar -X POST ${url}/0/devices/${agent.identity.deviceId}/d/led -d value=on
  curl -b jar ${url}/0/devices/${agent.identity.deviceId}/d/led        # acked >= time once the agent has it
  curl -b jar '${url}/0/devices/${agent.identity.deviceId}/d/led?latest=10'
  curl -b jar ${url}/0/devices/
  curl -b jar -X POST ${url}/0/devices/${agent.identity.deviceId}/ -d command=ping    # a command: its uuid
  curl -b jar ${url}/0/devices/${agent.identity.deviceId}/commands/                   # its state, output pong
(Signed up before? Log in instead: curl -c jar -b jar -X POST ${url}/0/session/login -d login=you@example.com -d password=change-me-now)

Try the agent, in another terminal:
  npm run agent -- var set temp 21.5 --socket ${rel(socket)}
  npm run agent -- var list --socket ${rel(socket)}
  npm run agent -- var watch --socket ${rel(socket)}
  npm run agent -- status --socket ${rel(socket)}
  npm run agent -- queue --socket ${rel(socket)}
  npm run agent -- fw status --socket ${rel(socket)}    # firmware updates: docs/firmware.md

Watch the MQTT traffic (the embedded broker lets devices touch only their own topics, so this uses the
bridge's credential, made anew at every start and kept in ${rel(credFile)}, mode 0600):
  mosquitto_sub -h 127.0.0.1 -p ${broker.port} -i ${broker.bridgeClientId}-watch -u ${broker.bridgeUsername} -P "$(cat ${rel(credFile)})" -t 'dc/v1/#' -v

Ctrl-C stops everything.
`);

let stopping = false;
const stop = async () => {
  if (stopping) return;
  stopping = true;
  await agent.stop();
  await closeBridge();
  process.exit(0);
};
process.once('SIGINT', () => void stop());
process.once('SIGTERM', () => void stop());
