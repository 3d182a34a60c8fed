#!/usr/bin/env -S node --max-semi-space-size=1 --v8-pool-size=1 --heap-growing-percent=20 --expose-gc --no-opt --optimize-for-size
// The flags above keep the agent small on a gateway (docs/agent.md, "Memory and the node flags", has the figures):
// a 1 MiB young generation; one GC helper thread; an old generation collected once it is 20% past what is live
// (for a heap as small as the agent's V8 grows it by at least 8 MB whatever the percentage); no optimizing compiler
// (about 8 MB less: TurboFan's code is never paged in, nor its working memory and output held; the baseline
// compiler, Sparkplug, stays for the throughput of `npm run bench -- agent-sync`); and full collections that compact
// the heap's fragmented pages, so that the collection after a burst (agent/idle-gc.ts) gives memory back. Unlike a hard heap limit, none
// of them can turn a large message into an out-of-memory crash. `--expose-gc` lets a firmware download free its
// socket buffers as it goes (agent/fw/download.ts) and the agent collect after a burst.
import { runCli } from './cli/index.js';

const code = await runCli(process.argv.slice(2));
process.exit(code);
