/**
 * The log of a one-shot command (`migrate`, `device`, `frontend`, `firmware`): stdout carries the command's output,
 * so the log goes to stderr, warnings and worse unless the config asks for more.
 */
import { type Logger, createLogger } from '../lib/log.js';
import type { BridgeConfig } from './config.js';

export function commandLog(config: BridgeConfig): Logger {
  return createLogger({
    level: config.log.level === 'info' ? 'warn' : config.log.level,
    pretty: 'never',
    base: { service: 'devcloud-bridge' },
    destination: process.stderr,
  });
}
