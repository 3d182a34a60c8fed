/**
 * The agent database's migrations, in order: migration N takes the schema from version N to N+1. Append only,
 * whatever part of the agent a new one serves; never edit a shipped one.
 */
import type { Migration, OpenOptions } from '../lib/sqlite.js';
import { COMMAND_MIGRATION, COMMAND_PROCESS_MIGRATION } from './commands/queue.js';
import { FIRMWARE_ERROR_CODE_MIGRATION, FIRMWARE_MIGRATION } from './fw/store.js';
import { UNVERIFIED_MIGRATION, VAR_MIGRATIONS } from './vars/store.js';

export const AGENT_MIGRATIONS: readonly Migration[] = [
  ...VAR_MIGRATIONS,
  COMMAND_MIGRATION,
  FIRMWARE_MIGRATION,
  COMMAND_PROCESS_MIGRATION,
  UNVERIFIED_MIGRATION,
  FIRMWARE_ERROR_CODE_MIGRATION,
];

/**
 * How the agent opens its database. Pages of 1 KiB: a change commits the variable's page, a history page and (in a
 * second commit) the acknowledgement stamp, each written whole to the log with a 24-byte header; with 4 KiB pages
 * every commit of one change dirties two blocks of the file system, with 1 KiB pages mostly one. Measured in
 * `npm run bench -- agent-sync` (docs/operations.md, "Flash wear").
 */
export const AGENT_DB_OPTIONS: OpenOptions = { pageSize: 1024 };
