/**
 * The fleet benchmark's baseline: the bare broker of fleet-echo.ts in its own process, on the port given as the
 * only argument.
 */
import { startEchoBroker } from './fleet-echo.js';

await startEchoBroker(Number(process.argv[2]), 'fleet-echo');
