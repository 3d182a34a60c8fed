#!/usr/bin/env -S node --max-semi-space-size=1 --v8-pool-size=1 --heap-growing-percent=20 --expose-gc
// The flags above keep the agent small on a gateway: a 1 MiB young generation, one GC helper thread, and an
// old generation let grow only 20% past what is live before it is collected. Unlike a hard heap limit, the last
// can never turn a large message into an out-of-memory crash. `--expose-gc` lets a firmware download free its
// socket buffers as it goes (agent/fw/download.ts). docs/agent.md has the figures.
import { runCli } from './cli/index.js';

const code = await runCli(process.argv.slice(2));
process.exit(code);
