export * from './codec.js';
export * from './schemas.js';
export * from './topics.js';
export * from './firmware.js';
