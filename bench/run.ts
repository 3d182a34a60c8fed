/**
 * Runs one benchmark: `npm run bench -- NAME [options]` loads `bench/NAME.ts` and calls its `run`. Every
 * benchmark measures its own baseline in the same run, prints a table, and ends with one JSON line.
 *
 * Exit codes: 0 every target met; 1 a target missed or the run failed; 2 usage (unknown benchmark or option).
 */
import { readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Cleanup, type BenchModule, UsageError } from './support/cleanup.js';

const here = dirname(fileURLToPath(import.meta.url));

function available(): string[] {
  return readdirSync(here)
    .filter((f) => f.endsWith('.ts') && f !== 'run.ts')
    .map((f) => f.slice(0, -'.ts'.length))
    .sort();
}

async function main(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  const names = available();
  if (!name || !names.includes(name)) {
    console.error(name ? `unknown benchmark: ${name}` : 'which benchmark?');
    console.error(`usage: npm run bench -- NAME [options]\navailable: ${names.join(', ')}`);
    return 2;
  }
  const mod = (await import(pathToFileURL(join(here, `${name}.ts`)).href)) as BenchModule;
  const cleanup = new Cleanup();
  // An interrupted run still stops its broker and agent and removes its temporary folders.
  let interrupted = false;
  const onSignal = (signal: NodeJS.Signals) => {
    interrupted = true;
    console.error(`\n${signal}: cleaning up`);
    void cleanup.run().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    return await mod.run(args, cleanup);
  } catch (err) {
    if (err instanceof UsageError) {
      console.error(`${name}: ${err.message}`);
      return 2;
    }
    // After a signal the run fails because its clients are being closed; that is not news.
    if (!interrupted) console.error(`${name} failed:`, err);
    return interrupted ? 130 : 1;
  } finally {
    await cleanup.run();
  }
}

// Exit explicitly: a client left half-closed by a failure must not keep the process alive.
process.exit(await main(process.argv.slice(2)));
