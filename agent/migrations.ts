/**
 * The agent database's migrations, in order: migration N takes the schema from version N to N+1. Append only,
 * whatever part of the agent a new one serves; never edit a shipped one.
 */
import type { Migration } from '../lib/sqlite.js';
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
