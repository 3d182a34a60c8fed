#!/usr/bin/env -S node --max-semi-space-size=1 --v8-pool-size=1 --heap-growing-percent=20 --expose-gc --no-opt --no-sparkplug --optimize-for-size
// The flags above keep the agent small on a gateway (docs/agent.md, "Memory and the node flags", has the figures):
// a 1 MiB young generation; one GC helper thread; an old generation collected once it is 20% past what is live
// (for a heap as small as the agent's V8 grows it by at least 8 MB whatever the percentage); no optimizing and no
// baseline compiler (V8's interpreter only: about 10 MB less, the compilers' code never paged in; the throughput
// targets of `npm run bench -- agent-sync` still hold); and full collections that compact the heap's fragmented
// pages, so that the collection after a burst (agent/idle-gc.ts) gives memory back. Unlike a hard heap limit, none
// of them can turn a large message into an out-of-memory crash. `--expose-gc` lets a firmware download free its
// socket buffers as it goes (agent/fw/download.ts) and the agent collect after a burst.
import { runCli } from './cli/index.js';

const code = await runCli(process.argv.slice(2));
process.exit(code);
